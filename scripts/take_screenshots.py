"""Screenshots of the console on real jobs, for the README: ``.venv/bin/python scripts/take_screenshots.py``.

It trains the demo job, runs a copy of the ``init`` project whose grader crashes on some rows,
serves the console on 127.0.0.1 and photographs the main pages in Debian's headless Chromium.
Everything runs in a temporary PLUGTUNE_HOME; the PNGs go to docs/screenshots/.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

CRASHING_GRADER = '''
from plugtune import grader


@grader
def exact(ctx, sample, trajectory):
    """From step 3 on, crashes on rows whose answer is odd: the demo of a plugin bug."""
    answer = sample.extra["answer"]
    ctx.logger.info("grading %r against %r", trajectory.completion, answer)
    if ctx.step >= 3 and int(answer) % 2:
        ctx.logger.error("odd answers are not handled yet")
        return 1.0 / (int(answer) % 2 - 1)
    return 1.0 if trajectory.completion.strip() == answer else 0.0
'''


def plugtune(*args: str, env: dict[str, str], cwd: Path) -> None:
    subprocess.run([str(ROOT / ".venv" / "bin" / "plugtune"), *args], env=env, cwd=cwd, check=False)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="plugtune-shots-"))
    env = dict(os.environ, PLUGTUNE_HOME=str(work / "state"))
    env.pop("PLUGTUNE_DATABASE_URL", None)
    plugtune("demo", env=env, cwd=work)  # job 1
    plugtune("init", str(work / "adder"), env=env, cwd=work)
    (work / "adder" / "plugins" / "grader.py").write_text(CRASHING_GRADER)
    job_yaml = work / "adder" / "job.yaml"
    plugtune("run", str(job_yaml), env=env, cwd=work / "adder")  # job 2, fails
    os.environ.update(env)
    shoot(work)
    print(f"screenshots in {OUT}")


def shoot(work: Path) -> None:
    import uvicorn
    from playwright.sync_api import sync_playwright

    from plugtune.settings import Settings
    from plugtune.store import Store
    from plugtune.web import create_app

    store = Store.open(Settings.from_env().database_url)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(store), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    failed = store.trajectories(2, status="failed", limit=1)
    OUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        shots = [
            ("jobs.png", f"{base}/jobs"),
            ("job-demo.png", f"{base}/jobs/1"),
            ("job-failed.png", f"{base}/jobs/2"),
            ("plugin-tab.png", f"{base}/jobs/2/plugins"),
            ("logs.png", f"{base}/jobs/2/logs"),
        ]
        if failed:
            selected = f"{base}/jobs/2/trajectories?status=failed&t={failed[0].trajectory_id}"
            shots.append(("trajectory-failed.png", selected))
            shots.append(("group.png", f"{base}/jobs/2/groups/{failed[0].group_id}"))
        for name, url in shots:
            page.goto(url)
            page.wait_for_load_state("networkidle")
            time.sleep(0.5)
            page.screenshot(path=str(OUT / name), full_page=True)
        browser.close()
    server.should_exit = True
    store.close()


if __name__ == "__main__":
    sys.exit(main())
