"""A Ray node that is really another host: its own network namespace behind a veth link, its own
/tmp, a Python without plugtune and no view of the project's checkout (see ``apart``). The head
(with this test process as driver) lends no CPU, so every instance runs on the node: the snapshot
and plugtune itself reach it over the link, its log lines come back, each failure is classified as
on the local backend, and a node that lacks plugtune (shipping off) is a Create faas fault naming
the node."""

from __future__ import annotations

import asyncio
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from plugtune.errors import Cause, PluginCallError
from plugtune.runtime.ray import RayRuntime
from plugtune.runtime.ray.nodes import lacks
from tests.runtime.helpers import ctx, entry, sample, trajectory
from tests.runtime.ray.apart import CHECKOUT, ApartCluster, Node, can_make_hosts, hidden_paths

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def apart() -> Iterator[ApartCluster]:
    why = can_make_hosts()
    if why:
        pytest.skip(f"separate hosts on this machine: {why}")
    home = Path(tempfile.mkdtemp(prefix="ptray-home-"))
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    cluster = ApartCluster()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(home))
        env.setenv("RAY_AUTH_MODE", "disabled")  # the nodes' mode (see LocalCluster._ray_start)
        try:
            cluster.start_head(num_cpus=0)
            cluster.add_node(num_cpus=2)
            ray.init(address=cluster.address, namespace="plugtune-apart", log_to_driver=False)
            cluster.wait_joined(ray)
            yield cluster
        finally:
            ray.shutdown()
            cluster.stop()
            shutil.rmtree(home, ignore_errors=True)
    assert not cluster.leftovers(), "a namespace, link or Ray process of the test outlived it"


def node_id(node: Node) -> str:
    [found] = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == node.ip]
    return str(found)


def tcp_established(node: Node, apart: ApartCluster) -> set[tuple[str, str]]:
    """(local, remote) addresses of the established TCP connections in the node's namespace."""
    listed = in_view_of(node, apart, "ss", "-tnH", "state", "established").stdout
    pairs = set()
    for line in listed.splitlines():
        local, remote = line.split()[-2:]
        pairs.add((bare_ip(local), bare_ip(remote)))
    return pairs


def bare_ip(end: str) -> str:
    return end.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")


def in_view_of(node: Node, apart: ApartCluster, *command: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in the node's namespaces (network and mount), as a process of that host."""
    raylets = [p for p in apart.pids_of(node) if psutil.Process(p).name() == "raylet"]
    assert raylets, "the node has no raylet"
    enter = ["nsenter", "-t", str(raylets[0]), "--net", "--mount", "--"]
    return subprocess.run([*enter, *command], capture_output=True, text=True, timeout=30)


def test_the_folder_holding_the_checkout_is_covered_wherever_it_lies() -> None:
    assert "/usr/lib" in hidden_paths(Path("/usr/lib/checkout"))  # as a CI clone at /check/work/main
    assert not any(h == "/tmp" or h.startswith("/tmp/") for h in hidden_paths(Path("/tmp/ci/checkout")))
    assert "/" not in hidden_paths(Path("/checkout"))
    covered = hidden_paths()
    assert CHECKOUT.is_relative_to("/tmp") or any(CHECKOUT.is_relative_to(h) for h in covered), covered
    assert not any(a != b and Path(a).is_relative_to(b) for a in covered for b in covered), covered


def test_the_node_is_another_host_linked_to_the_head_by_the_network(apart: ApartCluster) -> None:
    [node] = apart.nodes
    assert {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} == {apart.head_ip, node.ip}

    dialed = tcp_established(node, apart)
    assert (node.ip, apart.head_ip) in dialed, dialed  # the node talks to the head over the link
    assert all(ends[0] in (node.ip, "127.0.0.1") for ends in dialed), dialed

    assert in_view_of(node, apart, "test", "-e", str(CHECKOUT)).returncode == 1  # no checkout there
    marker = apart.head.temp_dir / "on-the-head-only"  # type: ignore[union-attr]
    marker.write_text("the head's /tmp")  # Ray names the node's temp dir as the head's, in its own /tmp
    assert in_view_of(node, apart, "test", "-d", str(marker.parent)).returncode == 0
    assert in_view_of(node, apart, "test", "-e", str(marker)).returncode == 1
    no_plugtune = in_view_of(node, apart, "/tmp/.node/venv/bin/python", "-c", "import plugtune")
    assert "No module named 'plugtune'" in no_plugtune.stderr, no_plugtune
    addresses = in_view_of(node, apart, "ip", "-o", "-4", "addr").stdout
    assert node.ip in addresses and apart.head_ip not in addresses, addresses


async def test_a_plugin_runs_on_the_node_from_the_snapshot_and_plugtune_shipped_there(
    apart: ApartCluster,
) -> None:
    [node] = apart.nodes
    async with RayRuntime(apart.address, metrics_period_s=0.5, start_timeout_s=60) as rt:
        fn = await rt.deploy(entry("ray_where.py", "where"))
        [instance] = fn.deployment.instances  # type: ignore[attr-defined]
        assert instance.node_id == node_id(node)
        outcome = await fn.invoke(ctx("traj-where"), sample(checkout=str(CHECKOUT)), trajectory())
        assert outcome.value == 1.0
        [said] = [line for line in fn.logs() if line.message.startswith("where: ")]
    assert said.trajectory_id == "traj-where" and said.instance_id.startswith(instance.id), said
    fields = dict(part.split("=", 1) for part in said.message.removeprefix("where: ").split())
    assert fields["checkout"] == "False", said.message  # it ran where the checkout is not
    # the snapshot's copy in the node's own /tmp (from Ray's working_dir there), and shipped plugtune
    assert fields["plugin"].startswith("/tmp/") and fields["plugin"].endswith("/ray_where.py"), said.message
    assert "/runtime_resources/py_modules_files/" in fields["plugtune"], said.message


async def test_each_failure_on_the_node_is_classified_with_its_logs(apart: ApartCluster) -> None:
    [node] = apart.nodes
    async with RayRuntime(apart.address, metrics_period_s=0.5, start_timeout_s=60) as rt:
        fn = await rt.deploy(entry("ray_faults.py", "misbehaves"))
        assert {i.node_id for i in fn.deployment.instances} == {node_id(node)}  # type: ignore[attr-defined]

        with pytest.raises(PluginCallError) as raised:
            await fn.invoke(ctx(), sample(do="raise"), trajectory())
        assert raised.value.cause == Cause.ERROR_500.value
        assert "ValueError: grader bug" in raised.value.message and "Traceback" not in raised.value.message
        assert raised.value.traceback.splitlines()[0].startswith("ray_faults.py:"), raised.value.traceback
        assert any("about to raise" in line.message for line in raised.value.logs)  # type: ignore[attr-defined]

        with pytest.raises(PluginCallError) as timed_out:
            await fn.invoke(ctx(), sample(do="hang"), trajectory())
        assert timed_out.value.cause == Cause.TIMEOUT.value and "timeout_s=4" in timed_out.value.message

        with pytest.raises(PluginCallError) as died:
            await fn.invoke(ctx(), sample(do="exit"), trajectory())
        assert died.value.cause == Cause.EOF.value and died.value.instance_id.startswith("r"), died.value
        assert any("stdout before exit" in line.message for line in died.value.logs)  # type: ignore[attr-defined]

        with pytest.raises(PluginCallError) as oom:
            await fn.invoke(ctx(), sample(do="oom"), trajectory())
        assert oom.value.cause == Cause.OOM.value and "memory_mb=200" in oom.value.message, oom.value

        assert (await fn.invoke(ctx(), sample(do="ok"), trajectory())).value == 1.0
        assert {i.node_id for i in fn.deployment.instances} == {node_id(node)}  # type: ignore[attr-defined]


async def test_a_node_without_plugtune_is_a_create_faas_fault_naming_it_when_shipping_is_off(
    apart: ApartCluster,
) -> None:
    [node] = apart.nodes
    async with RayRuntime(apart.address, start_timeout_s=60, ship_plugtune=False) as rt:
        with pytest.raises(PluginCallError) as info:
            await rt.deploy(entry("ray_where.py", "where"))
    error = info.value
    assert error.cause == Cause.CREATE_FAULT.value, error
    assert f"Ray node {node.ip} ({node_id(node)[:12]}) lacks plugtune" in error.message, error.message
    assert "No module named 'plugtune'" in error.message and "ship_plugtune on" in error.message
    assert f"Ray node {apart.head_ip}" not in error.message, error.message  # the head has it
    assert "Traceback" not in error.message and len(error.message) < 1000, error.message


def test_what_a_node_lacks_is_named_piece_by_piece() -> None:
    import sys

    import plugtune

    python = "{}.{}.{}".format(*sys.version_info[:3])
    good = {"python": python, "ray": "2.60.0", "missing": [], "plugtune": "/x", "plugtune_version": "0"}
    where = "Ray node 10.0.0.9 (abc)"
    assert lacks(where, good, shipped=True, ray_version="2.60.0") == []
    old = lacks(where, {**good, "python": "3.9.1"}, shipped=True, ray_version="2.60.0")
    assert old == [f"{where} runs Python 3.9.1, the driver Python {python.rsplit('.', 1)[0]}"]
    assert lacks(where, good, shipped=True, ray_version="2.61.0") == [
        f"{where} has Ray 2.60.0, the driver Ray 2.61.0"
    ]
    missing = {**good, "missing": [["plugtune.runtime.ray.host", "yaml", "ModuleNotFoundError: ..."]]}
    [text] = lacks(where, missing, shipped=True, ray_version="2.60.0")
    assert text.startswith(f"{where} lacks the Python module 'yaml' (pip install PyYAML=="), text
    stale = lacks(where, good, shipped=False, ray_version="2.60.0")
    assert stale == [f"{where} has plugtune 0 (/x), the driver plugtune {plugtune.__version__}"]


def test_a_job_rolls_out_and_grades_on_the_node_with_the_policy_relayed_over_the_link(
    apart: ApartCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.jobs.control import create_job
    from plugtune.jobs.scheduler import run_job
    from plugtune.settings import Settings
    from plugtune.store import Store
    from tests.runtime.ray.test_job import job_on

    state = tmp_path / "state"
    monkeypatch.setenv("PLUGTUNE_HOME", str(state))
    monkeypatch.setenv("PLUGTUNE_DATABASE_URL", f"sqlite:///{state / 'plugtune.db'}")
    monkeypatch.setenv("PLUGTUNE_RAY_ADDRESS", apart.address)
    home = Settings.from_env()
    store = Store.open(home.database_url)
    try:
        job_id, invalid = create_job(store, job_on(tmp_path / "job", "ray"))
        assert invalid is None, invalid
        status = run_job(store, home, job_id, wait_for_retries=False)
        job = store.get_job(job_id)
        assert status == "succeeded", job.error.to_dict() if job and job.error else status
        assert store.count_trajectories(job_id) == 2 * 2 * 2
        answered = store.logs(job_id, plugin="answer", text="answered", limit=50)
        assert answered and all(line.instance_id.startswith("r") for line in answered)
        placed = store.logs(job_id, plugin="answer", text="on Ray node", limit=50)
        [node] = apart.nodes
        assert placed and all(f"on Ray node {node_id(node)[:12]}" in line.message for line in placed)
    finally:
        store.close()


async def test_a_declared_dependency_is_reached_from_the_node_under_policy_only(apart: ApartCluster) -> None:
    """job.yaml's ``dependencies:`` reach the node's bridge: a judge on the head's host (by its name,
    as policy-only wants: a declared IP cannot be listened at inside the instance's network) answers
    the grader on the node; an undeclared one stays refused there; one declared on loopback is
    said at deploy to be each node's own."""
    from tests.judge_server import judge

    with judge(host=apart.head_ip) as server:
        url = f"http://{apart.head_name}:{server.server_address[1]}/ok"
        async with RayRuntime(apart.address, metrics_period_s=0.5, start_timeout_s=60) as rt:
            declared = await rt.deploy(entry("judge.py", "asks_judge_urllib"), dependencies={"judge": url})
            outcome = await declared.invoke(ctx(), sample(url=url), trajectory())
            assert outcome.value == 0.75
            loopback = {"local": "http://127.0.0.1:9/ok"}  # the node's own 127.0.0.1: said at deploy
            undeclared = await rt.deploy(entry("judge.py", "asks_judge_urllib"), dependencies=loopback)
            with pytest.raises(PluginCallError) as refused:
                await undeclared.invoke(ctx(), sample(url=url), trajectory())
        assert server.requests == 1  # type: ignore[attr-defined]
    warned = [line.message for line in undeclared.logs() if "declared at 127.0.0.1:9" in line.message]
    assert warned and "not the driver's" in warned[0], [line.message for line in undeclared.logs()]
    assert "network policy-only" in refused.value.message or any(
        "refused a connection" in line.message for line in undeclared.logs()
    ), refused.value


async def test_a_call_whose_link_is_cut_is_the_lost_node_s_eof_not_the_plugin_s_timeout(
    apart: ApartCluster,
) -> None:
    """Last in the module: the node stays cut off (the fixture removes it)."""
    [node] = apart.nodes
    async with RayRuntime(apart.address, metrics_period_s=0.5, start_timeout_s=60) as rt:
        fn = await rt.deploy(entry("ray_faults.py", "misbehaves"))  # timeout_s=4
        call = asyncio.create_task(fn.invoke(ctx(), sample(do="sleep", seconds=3.0), trajectory()))
        await asyncio.sleep(1.0)  # in flight on the node
        subprocess.run(["ip", "link", "set", node.veth, "down"], check=True, timeout=30)
        with pytest.raises(PluginCallError) as info:
            await asyncio.wait_for(call, 60)
    error = info.value
    assert error.cause == Cause.EOF.value, error  # the plugin would have answered in 3 s
    assert "is unreachable from the driver" in error.message and node.ip in error.message, error.message
    assert "Traceback" not in error.message, error.message
