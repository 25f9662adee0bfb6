"""Commands of the control plane: ``serve`` and ``functions``."""

from __future__ import annotations

import errno
import signal
import socket
from typing import Any

import typer

from plugtune.cli.base import JSON_OPTION, echo_json, opened_store


def functions(
    end_stale: bool = typer.Option(
        False,
        "--end-stale",
        help="End what attempts that were killed left on this machine: their functions' processes "
        "(a daemon a plugin started), uid leases and cgroups. Running jobs are never touched.",
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """The functions in use: each one's job, limits, instances and memory; the quota and its use;
    what killed attempts left behind.

    Functions in use are read from the store (each attempt records its plugins and samples their
    instances and memory every few seconds); leftovers from this machine (uid leases under
    /run/plugtune/uids and instance cgroups whose runtime process is gone). The quota holds each
    job's runtime on its own; raise it with the options of `plugtune serve` (--max-functions,
    --max-instances, --total-memory-mb), or PLUGTUNE_MAX_FUNCTIONS, PLUGTUNE_MAX_INSTANCES and
    PLUGTUNE_TOTAL_MEMORY_MB for `plugtune run`. Exits 1 when --end-stale could not end everything
    (it names what is left)."""
    from dataclasses import asdict

    from plugtune.jobs.functions import end_stale as end_leftovers
    from plugtune.jobs.functions import functions_view

    with opened_store() as (settings, store):
        if end_stale:
            found, ended = end_leftovers(store)
            if as_json:
                echo_json({"found": [asdict(x) for x in found], "ended": asdict(ended)})
            else:
                _print_ended(found, ended)
            if ended.problems:
                raise typer.Exit(1)
            return
        view = functions_view(store, settings)
    if as_json:
        echo_json(view.to_dict())
        return
    _print_functions(view)


def _print_functions(view: Any) -> None:
    q = view.quota
    typer.echo(
        f"quota of each job's runtime: {q['max_functions']} functions, {q['max_instances']} instances, "
        f"{q['total_memory_mb']} MiB of instances' memory_mb (plugtune serve --max-functions, "
        "--max-instances, --total-memory-mb)"
    )
    typer.echo(
        f"monitoring data of an ended plugin is kept {view.retention_days:g} days "
        "(plugtune serve --retention-days)"
    )
    for use in view.use:
        attempt = f" attempt {use.attempt}" if use.attempt is not None else ""
        typer.echo(
            f"\njob {use.job_id}{attempt}: {use.functions} of {q['max_functions']} functions, "
            f"{use.instances} of {q['max_instances']} instances, {use.memory_reserved_mb} of "
            f"{q['total_memory_mb']} MiB"
        )
        for f in (r for r in view.functions if r.job_id == use.job_id and r.attempt == use.attempt):
            typer.echo(f"  {_function_line(f)}")
            for proc in f.processes:
                typer.echo(f"    pid {proc.pid} {proc.role}: {proc.rss_mb:g} MiB resident")
    if not view.functions:
        typer.echo("\nno function is in use (no job is deploying or running plugins)")
    for note in view.notes:
        typer.echo(f"note: {note}")
    if view.leftovers:
        typer.echo("\nleft by attempts that were killed (end them: plugtune functions --end-stale):")
        for x in view.leftovers:
            typer.echo(f"  {_leftover_line(x)}")


def _function_line(f: Any) -> str:
    limits = f.limits
    if not limits:
        shown = "limits known once deployed"
    else:
        shown = (
            f"memory_mb {limits.get('memory_mb')}, cpu {limits.get('cpu')}, timeout_s "
            f"{limits.get('timeout_s')}, instances {limits.get('min_instances')}-"
            f"{limits.get('max_instances')}, max_concurrency {limits.get('max_concurrency')}, tmp_mb "
            f"{limits.get('tmp_mb')}, max_pids {limits.get('max_pids')}, network {limits.get('network')}"
        )
    now = "not sampled yet" if f.instances is None else f"{f.instances} instance(s)"
    if f.memory_used_mb is not None:
        now += f", fullest uses {f.memory_used_mb:g} of {f.memory_mb} MiB"
    return f"{f.plugin} ({f.role}) {f.status}: {now}; {shown}"


def _leftover_line(x: Any) -> str:
    job = f"job {x.job_id} ({x.job_status}) attempt {x.attempt}" if x.job_id is not None else "no job"
    procs = f"{len(x.processes)} process(es) still run: {' '.join(map(str, x.processes[:10]))}"
    return f"{x.kind} {x.what}: {job}, its runtime (pid {x.holder_pid}) is gone; " + (
        procs if x.processes else "no process runs"
    )


def _print_ended(found: list[Any], ended: Any) -> None:
    if not found:
        typer.echo("nothing to end: no killed attempt left a function behind")
        return
    for x in found:
        typer.echo(f"found {_leftover_line(x)}")
    typer.echo(
        f"ended {len(ended.processes)} process(es); gave back {len(ended.uids)} uid(s); removed "
        f"{len(ended.cgroups)} cgroup(s)"
    )
    for problem in ended.problems:
        typer.echo(f"could not end: {problem}", err=True)


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8321, min=1, max=65535, help="Port to listen on."),
    allowed_host: list[str] = typer.Option(
        [],
        "--allowed-host",
        metavar="NAME",
        help="A name the console may be reached by besides localhost, 127.0.0.1, ::1 and --host "
        "(repeatable; also PLUGTUNE_ALLOWED_HOSTS). Requests with any other Host header are refused.",
    ),
    max_running: int = typer.Option(
        1,
        "--max-running",
        min=1,
        max=64,
        help="Jobs run at once; the others wait in the queue, oldest first.",
    ),
    secret: list[str] = typer.Option(
        [],
        "--secret",
        metavar="NAME",
        help="A variable of this server's environment that jobs submitted over the API may import as "
        "`secrets:` (repeatable; also PLUGTUNE_SUBMIT_SECRETS). Any other secret is refused (422).",
    ),
    shared_dir: list[str] = typer.Option(
        [],
        "--shared-dir",
        metavar="DIR",
        help="A folder of this server whose files jobs submitted over the API may name as data or "
        "plugins (repeatable; also PLUGTUNE_SHARED_DIRS). Otherwise they read only the files they sent.",
    ),
    max_functions: int | None = typer.Option(
        None,
        "--max-functions",
        min=1,
        max=100_000,
        help="Quota of each job's function runtime: functions deployed at once (default 32; also "
        "PLUGTUNE_MAX_FUNCTIONS). Going over it is a Create faas fault.",
    ),
    max_instances: int | None = typer.Option(
        None,
        "--max-instances",
        min=1,
        max=100_000,
        help="Quota of each job's function runtime: instances running at once, all its functions "
        "together (default 64; also PLUGTUNE_MAX_INSTANCES).",
    ),
    total_memory_mb: int | None = typer.Option(
        None,
        "--total-memory-mb",
        min=1,
        max=64 << 20,
        help="Quota of each job's function runtime: the memory_mb of its running instances together "
        "(default 16384; also PLUGTUNE_TOTAL_MEMORY_MB).",
    ),
    retention_days: float | None = typer.Option(
        None,
        "--retention-days",
        min=0.001,
        max=36_500,
        help="How long a plugin's monitoring data (metrics, log lines) is kept after it ended (default "
        "7; also PLUGTUNE_RETENTION_DAYS); the Plugin tab says when it expires.",
    ),
) -> None:
    """Start the control plane: JSON API (/docs), web console, scheduler for submitted jobs.

    Its address is kept in $PLUGTUNE_HOME/serve.json while it runs (`plugtune submit` prints it), and
    `plugtune run` on its store is refused meanwhile; while a `plugtune run` supervises a job of the
    store, the scheduler waits for it to end (the console works). Exits 1 without starting anything
    when the port cannot be listened on (choose another with --port).

    `plugtune functions` (and the console's Functions page) shows the functions in use against the
    quota that --max-functions, --max-instances and --total-memory-mb set."""
    import uvicorn

    from plugtune.jobs.remote import forget_serve, record_serve
    from plugtune.jobs.scheduler import Scheduler
    from plugtune.jobs.supervisor_lock import ServeLock
    from plugtune.web import create_app

    _export_settings(
        PLUGTUNE_MAX_FUNCTIONS=max_functions,
        PLUGTUNE_MAX_INSTANCES=max_instances,
        PLUGTUNE_TOTAL_MEMORY_MB=total_memory_mb,
        PLUGTUNE_RETENTION_DAYS=retention_days,
    )
    policy = _submission_policy(secret, shared_dir)
    sock = _listening_socket(host, port)  # before anything is printed or started
    with sock, opened_store(create=True) as (settings, store):
        scheduler = Scheduler(store, settings, max_running=max_running)
        bound = [host] if host not in ("0.0.0.0", "::", "") else []
        hosts = [*bound, *settings.allowed_hosts, *allowed_host]
        app_ = create_app(
            store,
            api_token=settings.api_token,
            on_retry=scheduler.wake,
            on_cancel=scheduler.cancel,
            allowed_hosts=hosts,
            home=settings.home,
            submission_policy=policy,
        )
        lock = ServeLock(settings.home)  # one supervisor of the store's jobs: this server, or runs
        runs = lock.start(scheduler.start)
        url = _console_url(host, sock.getsockname()[1])
        record_serve(settings.home, url)
        previous = signal.signal(signal.SIGTERM, _forget_serve_then_end(settings.home))
        if runs:
            typer.echo(
                f"plugtune serve: a plugtune run (pid {', '.join(map(str, runs))}) supervises a job of "
                "this store: the scheduler starts when it ends (the console works meanwhile)",
                err=True,
            )
        typer.echo(f"plugtune console: {url}  (API docs: {url}docs)")
        try:
            uvicorn.Server(uvicorn.Config(app_, host=host, port=port, log_level="warning")).run([sock])
        finally:
            forget_serve(settings.home)
            signal.signal(signal.SIGTERM, previous)
            lock.close(scheduler.stop)


def _export_settings(**given: float | None) -> None:
    """Options given to `serve` as the variables Settings reads, so the store and every attempt this
    server starts (they inherit its environment) use them."""
    import os

    for name, value in given.items():
        if value is not None:
            os.environ[name] = f"{value:g}" if isinstance(value, float) else str(value)


def _forget_serve_then_end(home: Any) -> Any:
    """SIGTERM's handler once uvicorn has shut down (it hands the signal back): remove serve.json,
    then end by the signal as before (the jobs' attempts end with this process; the next server
    resumes them: ``recover_interrupted``)."""
    from plugtune.jobs.remote import forget_serve

    def end(signum: int, frame: Any) -> None:
        forget_serve(home)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    return end


def _submission_policy(secrets: list[str], shared: list[str]) -> Any:
    """The secrets and folders `serve` lets submitted jobs use; exit 1 naming a bad one."""
    from pathlib import Path

    from plugtune.settings import Settings
    from plugtune.spec.models import check_env_name
    from plugtune.spec.reach import SubmissionPolicy

    settings = Settings.from_env()

    names = frozenset([*settings.submit_secrets, *secrets])
    for name in sorted(names):
        try:
            check_env_name(name)
        except ValueError as exc:
            typer.echo(f"plugtune serve: --secret {name!r}: {exc}", err=True)
            raise typer.Exit(1) from None
    dirs = tuple(d.resolve() for d in [*settings.shared_dirs, *map(Path, shared)])
    for folder in dirs:
        home = settings.home
        if not folder.is_dir() or folder.is_relative_to(home) or home.is_relative_to(folder):
            typer.echo(
                f"plugtune serve: --shared-dir {folder} must be an existing folder apart from "
                f"PLUGTUNE_HOME ({settings.home})",
                err=True,
            )
            raise typer.Exit(1)
    return SubmissionPolicy(shared_dirs=dirs, secrets=names)


def _console_url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"http://[{shown}]:{port}/" if ":" in shown else f"http://{shown}:{port}/"


def _listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or a one-line error saying what to do (exit 1)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        typer.echo(f"plugtune serve: --host {host!r} is not an address here ({exc.strerror})", err=True)
        raise typer.Exit(1) from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts at once
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            why = "is already in use (another `plugtune serve`?); stop that process or choose a free port"
        elif exc.errno == errno.EACCES:
            why = "needs privileges to listen on; choose a port above 1023"
        else:
            why = f"cannot be listened on ({exc.strerror}); check --host or choose another port"
        typer.echo(f"plugtune serve: port {port} on {host} {why} with --port", err=True)
        raise typer.Exit(1) from None
    return sock
