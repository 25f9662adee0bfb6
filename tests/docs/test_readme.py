"""The README stays a short entry that tells the truth: at most 12 KB, every link it makes leads to
a file of the repository, its failure taxonomy names every error type and cause of
``plugtune.errors``, every ``plugtune`` command and option of its user's path exists in the CLI,
every pip extra it names is one of pyproject's (and each of pyproject's is named), and the make
targets it gives are the Makefile's. The rest moved to the docs site (``tests/docs/test_site.py``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import tomllib

from plugtune import errors

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def readme() -> str:
    return README.read_text()


def section(title: str) -> str:
    """The README's text under ``## title``, up to the next ``## ``."""
    text = readme()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= 12 * 1024, f"README.md is {size:,} bytes; the limit is 12 KB: move the detail to docs/"


def test_every_link_of_the_readme_leads_to_a_file() -> None:
    links = re.findall(r"\]\(([^)\s]+)\)", readme())
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) >= 15, local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    screenshots = [link for link in local if link.startswith("docs/screenshots/")]
    assert len(screenshots) == 1, f"the README shows one screenshot, not {screenshots}"


def test_the_readme_taxonomy_names_every_type_and_cause() -> None:
    table = section("Failure taxonomy")
    members: list[Any] = [*errors.ErrorType, *errors.Cause, *errors.StatusCause, *errors.DependencyCause]
    missing = [m.value for m in members if f"`{m.value}`" not in table and m.value not in table]
    assert not missing, f"README's failure taxonomy lacks: {missing}"
    for kind, owner in errors.OWNERS.items():
        row = next((line for line in table.splitlines() if line.startswith(f"| `{kind.value}` |")), None)
        assert row is not None, f"README's failure taxonomy has no row for {kind.value}"
        assert owner.value in row, f"README's row for {kind.value} does not name its owner {owner.value}"


def cli_tree() -> dict[str, set[str]]:
    """'jobs list' -> its options and argument names, for every command."""
    import typer.main

    from plugtune.cli import app

    out: dict[str, set[str]] = {}

    def walk(cmd: Any, ctx: Any, words: list[str]) -> None:
        out[" ".join(words)] = {o for p in cmd.params for o in [*p.opts, *p.secondary_opts]}
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub, sub.context_class(sub, info_name=name, parent=ctx), [*words, name])

    root = typer.main.get_command(app)
    walk(root, root.context_class(root, info_name="plugtune"), [])
    return out


def commands_in_readme() -> Iterator[tuple[str, list[str]]]:
    """(command words, options) of every ``plugtune ...`` line in the README's code blocks;
    ``jobs list | show ID | retry ID`` gives one per alternative."""
    fenced, lines = False, []
    for line in readme().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced:
            lines.append(line)
    for line in lines:
        line = line.split("#")[0].strip()
        if not line.startswith("plugtune "):
            continue
        line = line.split("&&")[0]
        head, *alternatives = [part.split() for part in line[len("plugtune ") :].split(" | ")]
        yield from _command(head)
        for alternative in alternatives:
            yield from _command([head[0], *alternative])


def _command(tokens: list[str]) -> Iterator[tuple[str, list[str]]]:
    words = [t for t in tokens if re.fullmatch(r"[a-z][a-z-]*", t)]
    options = [t.split("=")[0] for t in tokens if t.startswith("--")]
    yield " ".join(words), options


def test_every_command_of_the_readme_exists() -> None:
    tree = cli_tree()
    seen = list(commands_in_readme())
    assert len(seen) >= 15, seen
    problems = []
    for words, options in seen:
        # the longest prefix of the words that is a command (the rest are its arguments, e.g. my-task)
        split = words.split()
        command = next(
            (" ".join(split[:n]) for n in range(len(split), 0, -1) if " ".join(split[:n]) in tree), None
        )
        if command is None:
            problems.append(f"plugtune {words}: no such command")
            continue
        problems += [f"plugtune {command}: no option {o}" for o in options if o not in tree[command]]
    assert not problems, "README's commands out of step with the CLI:\n" + "\n".join(problems)


def test_the_readme_names_every_pip_extra() -> None:
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    pip = section("With pip")
    installed = re.search(r'pip install "\.\[([a-z,]+)\]"', pip)
    assert installed is not None, 'README\'s pip section has no pip install ".[extras]" line'
    unknown = set(installed.group(1).split(",")) - extras
    assert not unknown, f"README installs extras pyproject does not have: {unknown}"
    unnamed = [e for e in sorted(extras) if f"`{e}`" not in pip]
    assert not unnamed, f"README's pip section does not say what these extras are: {unnamed}"


def test_the_readme_set_up_commands_are_make_targets() -> None:
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][a-z-]*):", makefile, re.M))
    named = set(re.findall(r"`?make ([a-z][a-z-]*)", readme()))
    assert {"demo", "test", "docs", "docs-serve"} <= named, named
    assert named <= targets, f"README names make targets the Makefile lacks: {named - targets}"
    assert re.search(r"^test:.*\bdocs\b", makefile, re.M), "make test must build the docs site"
