"""The ``plugtune`` command line, by command group; each command's docstring is its ``--help``.

``app`` is the console script (``plugtune = "plugtune.cli:app"``). The commands are registered here,
in the order ``plugtune --help`` lists them.
"""

from __future__ import annotations

from plugtune.cli import data, evidence, jobs, project, regrade, server, training
from plugtune.cli.base import app, jobs_app

__all__ = ["app"]

app.command()(project.version)
app.command()(project.lint)
app.command()(project.init)
app.command("test")(project.test_plugins)
app.command()(training.run)
app.command()(training.submit)
app.command("eval")(training.eval_model)
jobs_app.command("list")(jobs.jobs_list)
jobs_app.command("show")(jobs.jobs_show)
jobs_app.command("retry")(jobs.jobs_retry)
jobs_app.command("cancel")(jobs.jobs_cancel)
app.command()(evidence.logs)
app.command()(evidence.trajectories)
app.command()(evidence.replay)
app.command()(regrade.regrade)
regrade.fixture_app.command("add")(regrade.fixture_add)
app.command()(evidence.doctor)
data.data_app.command("quarantine")(data.quarantine)
app.command()(server.functions)
app.command()(server.serve)
app.command()(training.demo)
