"""The docs site is built from the code, so it cannot drift: this builds it as ``make docs`` does
(``mkdocs build --strict``, a real process, offline) and holds the built pages to the code itself.

Every key of job.yaml (walked here from the pydantic models, independently of ``docs/hooks.py``),
every command, argument and option of the CLI (walked from the Typer app's click command tree) and
every error type, owner and cause with its hint (from ``plugtune.errors``) must be on the built
site, in the section that documents it. A key, command or cause added to the code and missing
from the site fails here with its name.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).with_name("mkdocs")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: install the docs extra (pip install -e '.[docs]'; make test does)")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def page(site: Path, name: str) -> str:
    path = site / name / "index.html"
    assert path.is_file(), f"the site has no page {name}/ (looked for {path})"
    return path.read_text()


def text_of(markup: str) -> str:
    """The words of some HTML, as a reader sees them: tags dropped, entities read, spaces collapsed."""
    inline = re.sub(r"</?(?:code|em|strong|a|span|abbr|kbd)\b[^>]*>", "", markup)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def words(text: str) -> str:
    """Prose from the code, as the site renders it: markdown's backticks gone, spaces collapsed."""
    return " ".join(text.replace("``", "").replace("`", "").split())


def section(markup: str, anchor: str) -> str:
    """The HTML from the heading whose id is ``anchor`` to the next heading of any level."""
    start = re.search(rf'<h[1-6][^>]*\bid="{re.escape(anchor)}"', markup)
    assert start is not None, f"no heading with id {anchor!r}"
    end = re.compile(r"<h[1-6][\s>]").search(markup, start.end())
    return markup[start.start() : end.start() if end else len(markup)]


# ---------------------------------------------------------------------------------------------
# job.yaml: every key of every section


def _sections(annotation: Any) -> Iterator[tuple[type[BaseModel], str]]:
    """The pydantic sections a field holds and how their keys continue its path."""
    origin, args = get_origin(annotation), get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation, "."
    elif origin in (list, tuple) and args:
        for model, _ in _sections(args[0]):
            yield model, "[]."
    elif origin is dict and len(args) == 2:
        for model, _ in _sections(args[1]):
            yield model, ".<key>."
    elif origin is Union or type(annotation).__name__ == "UnionType":
        for arg in args:
            yield from _sections(arg)


def job_yaml_keys(
    model: type[BaseModel], prefix: str = "", seen: frozenset[type] = frozenset()
) -> Iterator[tuple[str, str]]:
    """(dotted path, description) of every key under ``model``, nested sections included."""
    for name, info in model.model_fields.items():
        path = prefix + name
        yield path, info.description or ""
        for sub, joint in _sections(info.annotation):
            if sub not in seen:
                yield from job_yaml_keys(sub, path + joint, seen | {model})


def test_every_job_yaml_key_is_on_the_site(site: Path) -> None:
    from plugtune.spec.models import JobSpec

    markup = page(site, "reference/job-yaml")
    text = text_of(markup)
    keys = list(job_yaml_keys(JobSpec))
    assert len(keys) > 100, f"the walk found only {len(keys)} keys"
    missing = [path for path, _ in keys if f"<code>{html.escape(path, quote=False)}</code>" not in markup]
    assert not missing, f"job.yaml keys missing from the job.yaml reference: {missing}"
    undescribed = [path for path, doc in keys if doc and words(doc) not in text]
    assert not undescribed, f"job.yaml keys whose description is not on the site: {undescribed}"
    for name in JobSpec.model_fields:  # each top-level key has its own linkable section
        assert f'id="{name}"' in markup, f"job.yaml reference: no section for {name}"


def test_the_job_yaml_reference_shows_defaults_and_limits(site: Path) -> None:
    row = re.search(
        r"<tr>\s*<td><code>hyperparameters\.batch_size</code></td>(.*?)</tr>",
        page(site, "reference/job-yaml"),
        re.S,
    )
    assert row is not None
    cells = [text_of(c) for c in re.findall(r"<td>(.*?)</td>", row.group(1), re.S)]
    assert cells[:3] == ["integer", "4", ">= 1, <= 4096"], cells


# ---------------------------------------------------------------------------------------------
# CLI: every command, argument and option


def commands() -> Iterator[tuple[list[str], Any]]:
    import typer.main

    from plugtune.cli import app

    root = typer.main.get_command(app)

    def walk(cmd: Any, ctx: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if not getattr(sub, "hidden", False):
                    yield from walk(sub, sub.context_class(sub, info_name=name, parent=ctx), [*path, name])

    yield from walk(root, root.context_class(root, info_name="plugtune"), [])


def test_every_cli_command_and_option_is_on_the_site(site: Path) -> None:
    markup = page(site, "reference/cli")
    found = list(commands())
    names = {" ".join(p) for p, _ in found}
    assert {"run", "test", "serve", "jobs retry", "doctor", "replay"} <= names, names
    problems = []
    for path, cmd in found:
        anchor = "-".join(["plugtune", *path])
        if f'id="{anchor}"' not in markup:
            problems.append(f"plugtune {' '.join(path)}: no section #{anchor}")
            continue
        here = section(markup, anchor)
        here_text = text_of(here)
        first = (cmd.help or "").strip().split("\n\n")[0]
        if first and words(first) not in here_text:
            problems.append(f"plugtune {' '.join(path)}: its help is not in its section")
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue
            for opt in [*param.opts, *param.secondary_opts]:
                shown = opt if opt.startswith("-") else param.name.upper()
                if shown not in here_text:
                    problems.append(f"plugtune {' '.join(path)}: {shown} missing")
            if param.help and words(param.help) not in here_text:
                problems.append(f"plugtune {' '.join(path)}: the help of {param.name} missing")
    assert not problems, "CLI reference out of step with the code:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------------
# failure taxonomy: every type, owner, cause and what to do


def test_every_failure_cause_and_hint_is_on_the_site(site: Path) -> None:
    from plugtune import errors

    text = text_of(page(site, "failures"))
    members: list[Any] = [*errors.ErrorType, *errors.Cause, *errors.StatusCause, *errors.DependencyCause]
    missing = [m.value for m in members if m.value not in text]
    assert not missing, f"failure types or causes missing from the Failures page: {missing}"
    for kind, owner in errors.OWNERS.items():
        assert f"{kind.value} {owner.value}" in text, f"{kind.value}: its owner {owner.value} is not shown"
    hints = [*errors.HINTS.values(), *errors.TIMEOUT_HINTS.values()]
    unhinted = [h[:60] for h in hints if words(h) not in text]
    assert not unhinted, f"hints (what to do) missing from the Failures page: {unhinted}"


# ---------------------------------------------------------------------------------------------
# the rest of the site


def test_every_page_of_docs_is_built_and_the_api_comes_from_docstrings(site: Path) -> None:
    docs = ROOT / "docs"
    pages = [p.relative_to(docs).with_suffix("") for p in docs.rglob("*.md")]
    assert len(pages) >= 20, pages
    for rel in pages:
        name = "" if rel.name == "index" else rel.name
        built = site / rel.parent / name / "index.html"
        assert built.is_file(), f"docs/{rel}.md was not built"
    api = text_of(page(site, "reference/api"))
    from plugtune.runtime.runtime import LocalRuntime
    from plugtune.sdk.context import Context

    for doc in (Context.__doc__, LocalRuntime.__doc__):
        first = (doc or "").strip().split("\n\n")[0]
        assert words(first).replace("``", "") in api.replace("``", ""), first[:80]


def test_the_site_needs_nothing_from_the_network(site: Path) -> None:
    remote = re.compile(r"""<(?:link|script|img)[^>]+(?:href|src)="(https?:)?//""")
    for built in site.rglob("*.html"):
        found = remote.search(built.read_text())
        assert found is None, f"{built.relative_to(site)} loads {found.group(0)!r} from the network"
