"""The docs site's generated references, written from the code at every build (mkdocs ``hooks:``).

A page holds a marker line ``<!-- generated: NAME -->`` and :func:`on_page_markdown` puts in its
place the markdown that :data:`GENERATORS` makes from the code itself:

- ``job-yaml``: every key of job.yaml from the pydantic models of :mod:`plugtune.spec.models`
  (:class:`~plugtune.spec.models.JobSpec` and every section under it, ``hyperparameters`` included):
  its dotted path, type, default, limits and description;
- ``cli``: every command of the Typer app (:mod:`plugtune.cli`), walked as a click command tree
  (``typer.main.get_command``): usage, help, arguments and options;
- ``taxonomy``: every error type, owner, cause and what to do, from :mod:`plugtune.errors`.

Nothing generated is written to disk, so nothing can drift: a key, command or cause added to the
code is on the site at the next build, and ``tests/docs`` checks the built site against the code.
A page's marker naming no generator, a line that looks like a marker but is not one (misspelt,
spaced or cased otherwise), or a generator whose marker is on no page fails the build with one
line naming the page and line (mkdocs' ``PluginError``: no traceback).
"""

from __future__ import annotations

import difflib
import enum
import html
import re
import types
from collections.abc import Callable, Iterator
from typing import Any, Literal, Union, get_args, get_origin

from mkdocs.exceptions import PluginError

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)
#: A comment line, whose first word may mean "generated" (a marker, exact or misspelt).
LIKE_MARKER = re.compile(r"^[ \t]*<!--[ \t]*([A-Za-z]+).*-->[ \t]*$", re.MULTILINE)

# ---------------------------------------------------------------------------------------------
# job.yaml


_MARKDOWN = re.compile(r"([\\_*\[\]])")


def _prose(text: str) -> str:
    """Text from the code as markdown shows it literally: no tag, no emphasis, no link (``__x__``
    stays ``__x__``); a code span (between backticks) stays as written."""
    parts = str(text).split("`")
    if len(parts) % 2 == 0:  # an unmatched backtick: no code spans at all
        parts = ["'".join(parts)]
    return "`".join(
        p if i % 2 else _MARKDOWN.sub(r"\\\1", html.escape(p, quote=False)) for i, p in enumerate(parts)
    )


def _cell(text: str) -> str:
    """:func:`_prose` on one line, inside a markdown table cell (a pipe would end the cell)."""
    parts = _prose(" ".join(str(text).split())).split("`")
    return "`".join(p.replace("|", "\\|") if i % 2 else p.replace("|", "&#124;") for i, p in enumerate(parts))


def _code(text: str) -> str:
    """``text`` as inline code inside a table cell."""
    return "<code>" + html.escape(text, quote=False).replace("|", "&#124;") + "</code>"


def _is_model(annotation: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _strip_optional(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (annotation, False)."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return (rest[0] if len(rest) == 1 else Union[tuple(rest)]), True  # noqa: UP007
    return annotation, False


def type_text(annotation: Any) -> str:
    """A field's type as a reader of job.yaml thinks of it."""
    inner, optional = _strip_optional(annotation)
    origin, args = get_origin(inner), get_args(inner)
    if origin is Literal:
        text = "one of " + ", ".join(repr(a) if isinstance(a, str) else str(a) for a in args)
    elif origin in (list, tuple):
        item = args[0] if args else Any
        text = f"list of {type_text(item)}"
    elif origin is dict:
        key, value = args if len(args) == 2 else (Any, Any)
        text = f"mapping of {type_text(key)} to {type_text(value)}"
    elif get_origin(inner) is not None and get_args(inner) and hasattr(inner, "__metadata__"):
        text = type_text(get_args(inner)[0])  # Annotated[X, ...]
    elif _is_model(inner):
        text = "mapping (section)"
    elif isinstance(inner, type) and issubclass(inner, enum.Enum):
        text = "one of " + ", ".join(repr(m.value) for m in inner)
    elif isinstance(inner, type):
        text = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            inner.__name__, inner.__name__
        )
    elif origin is not None and args:  # a union of several types
        text = " or ".join(type_text(a) for a in args)
    else:
        text = str(inner).replace("typing.", "")
    return f"{text}, optional" if optional else text


def limits_text(info: Any) -> str:
    """The bounds pydantic checks on a field: ``>= 1``, ``<= 4096``, length, pattern."""
    out = []
    for meta in info.metadata:
        for attr, sign in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value:g}" if isinstance(value, float) else f"{sign} {value}")
        if getattr(meta, "min_length", None) is not None:
            out.append(f"length >= {meta.min_length}")
        if getattr(meta, "max_length", None) is not None:
            out.append(f"length <= {meta.max_length}")
        if getattr(meta, "pattern", None):
            out.append(f"matches `{meta.pattern}`")
    return ", ".join(out)


def default_text(info: Any) -> str:
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        try:
            value = info.default_factory()
        except TypeError:  # a factory that takes the validated data
            return "(computed)"
        if _is_model(type(value)):
            return "(section defaults)"
        return repr(value) if value not in ({}, [], ()) else ("{}" if value == {} else "[]")
    value = info.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, enum.Enum):
        return repr(value.value)
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return repr(value)


def nested(annotation: Any) -> tuple[type | None, str]:
    """The section model under a field and how its keys continue the path: ``.`` for a section,
    ``[].`` for a list of sections, ``.<key>.`` for a mapping of names to sections."""
    inner, _ = _strip_optional(annotation)
    origin, args = get_origin(inner), get_args(inner)
    if _is_model(inner):
        return inner, "."
    if origin in (list, tuple) and args and _is_model(args[0]):
        return args[0], "[]."
    if origin is dict and len(args) == 2:
        value, _ = _strip_optional(args[1])
        if _is_model(value):
            return value, ".<key>."
    return None, ""


def spec_rows(model: type, prefix: str = "", seen: tuple[type, ...] = ()) -> Iterator[tuple[str, Any, Any]]:
    """(dotted path, field info, the model that holds it) for every key under ``model``."""
    for name, info in model.model_fields.items():  # type: ignore[attr-defined]
        path = prefix + name
        yield path, info, model
        section, joint = nested(info.annotation)
        if section is not None and section not in seen:
            yield from spec_rows(section, path + joint, (*seen, model))


def _first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return " ".join(doc.strip().split("\n\n")[0].split())


def job_yaml_reference() -> str:
    from plugtune.spec.models import JobSpec

    out = [
        "Every key of job.yaml, generated from the pydantic models that validate it "
        "(`plugtune/spec/models.py`, and `plugtune/trainer/config.py` for `hyperparameters`). "
        "`<key>` stands for a name you choose (a dependency's, a plugin's) or, under `by_cause`, a "
        "cause; `[]` for each item of a list. A key that is not listed here is an `Invalid value` "
        "naming its file, line and field.",
        "",
    ]
    for name, info in JobSpec.model_fields.items():
        section, _ = nested(info.annotation)
        out += [f"## `{name}`", ""]
        if info.description and section is not None:  # a plain key says it in its row
            out += [" ".join(info.description.split()), ""]
        if section is not None and section.__doc__:
            out += [_first_paragraph(section.__doc__), ""]
        out += ["| key | type | default | limits | description |", "|---|---|---|---|---|"]
        rows = [(name, info, JobSpec)]
        if section is not None:
            rows += list(spec_rows(section, name + nested(info.annotation)[1], (JobSpec,)))
        for path, field, _owner in rows:
            out.append(
                f"| {_code(path)} | {_cell(type_text(field.annotation))} | {_cell(default_text(field))} "
                f"| {_cell(limits_text(field))} | {_cell(field.description or '')} |"
            )
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# CLI


def command_tree() -> Iterator[tuple[list[str], Any, Any]]:
    """(words after ``plugtune``, command, context) for every command and group, depth first, in
    the order ``--help`` lists them."""
    import typer.main

    from plugtune.cli import app

    root = typer.main.get_command(app)
    root_ctx = root.context_class(root, info_name="plugtune")  # typer ships its own click

    def walk(cmd: Any, ctx: Any, words: list[str]) -> Iterator[tuple[list[str], Any, Any]]:
        yield words, cmd, ctx
        if hasattr(cmd, "list_commands"):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is None or getattr(sub, "hidden", False):
                    continue
                sub_ctx = sub.context_class(sub, info_name=name, parent=ctx)
                yield from walk(sub, sub_ctx, [*words, name])

    yield from walk(root, root_ctx, [])


def anchor(words: list[str]) -> str:
    """The id of a command's heading: ``plugtune-jobs-list``."""
    return "-".join(["plugtune", *words])


def _param_type(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if annotation is None:
        return "text"
    text = type_text(annotation)
    bounds = [
        f">= {param.min}" if getattr(param, "min", None) is not None else "",
        f"<= {param.max}" if getattr(param, "max", None) is not None else "",
    ]
    bounds = [b for b in bounds if b]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _param_default(param: Any) -> str:
    if getattr(param, "required", False):
        return "required"
    value = param.default
    if value is None or value == "" or value == () or value == []:
        return ""
    if callable(value):
        return "(computed)"
    return repr(value) if not isinstance(value, bool) else str(value).lower()


def cli_reference() -> str:
    out = [
        "Every command of `plugtune`, generated from the Typer app (`plugtune/cli/`) at each build: "
        "the same text `plugtune COMMAND --help` prints. Every read command takes `--json` and "
        "prints one JSON document.",
        "",
    ]
    for words, cmd, ctx in command_tree():
        name = " ".join(["plugtune", *words])
        depth = min(2 + len(words[:-1]), 4) if words else 2
        out += [f"{'#' * depth} `{name}` {{ #{anchor(words)} }}", ""]
        usage = cmd.get_usage(ctx).replace("Usage: ", "", 1)
        out += ["```", usage, "```", ""]
        if cmd.help:
            text = cmd.help.split("\f")[0]
            out += [_prose(p.strip()) + "\n" for p in text.split("\n\n") if p.strip()]
        if hasattr(cmd, "list_commands"):
            names = cmd.list_commands(ctx)
            subs = [s for s in names if not getattr(cmd.get_command(ctx, s), "hidden", False)]
            if subs:
                out += [
                    "Commands: " + ", ".join(f"[`{s}`](#{anchor([*words, s])})" for s in subs),
                    "",
                ]
        params = [p for p in cmd.params if not getattr(p, "hidden", False)]
        if params:
            out += ["| argument or option | type | default | description |", "|---|---|---|---|"]
            for p in params:
                is_option = bool(p.opts and p.opts[0].startswith("-"))
                names = ", ".join([*p.opts, *p.secondary_opts]) if is_option else p.name.upper()
                help_text = getattr(p, "help", "") or ""
                if getattr(p, "envvar", None):
                    help_text += f" (environment: {p.envvar})"
                out.append(
                    f"| {_code(names)} | {_cell(_param_type(p))} | {_cell(_param_default(p))} "
                    f"| {_cell(help_text)} |"
                )
            out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# failure taxonomy


def taxonomy() -> str:
    from plugtune import errors

    hints = errors.HINTS
    out = [
        "Generated from `plugtune/errors.py`: every error type, its owner and what to do, then every "
        "cause with the hint plugtune prints with it (`plugtune doctor`, the job page, `--json`).",
        "",
        "| type | owner | what to do |",
        "|---|---|---|",
    ]
    by_cause = "Depends on the cause: see [each cause below](#call-plugin-error-what-the-runtime-found)."
    for kind in errors.ErrorType:
        todo = _cell(hints[kind]) if kind in hints else by_cause
        out.append(f"| `{kind.value}` | {errors.OWNERS[kind].value} | {todo} |")
    out.append("")
    families: list[tuple[str, Any, str]] = [
        (
            "Call plugin error: what the runtime found",
            errors.Cause,
            "The runtime's finding for a failed plugin call, exactly one per call.",
        ),
        (
            "Call plugin error: the plugin's own verdict",
            errors.StatusCause,
            _first_paragraph(errors.StatusCause.__doc__),
        ),
        (
            "Dependency error: the service a plugin calls",
            errors.DependencyCause,
            _first_paragraph(errors.DependencyCause.__doc__),
        ),
    ]
    for title, family, intro in families:
        out += [f"### {title}", "", intro, ""]
        for member in family:
            out += [f"#### `{member.value}`", "", _prose(hints[member]), ""]
            if member is errors.Cause.TIMEOUT:
                out += [
                    "For an `async def` plugin the hint says: " + _prose(errors.TIMEOUT_HINTS[True]),
                    "",
                    "For a sync plugin: " + _prose(errors.TIMEOUT_HINTS[False]),
                    "",
                ]
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {
    "job-yaml": job_yaml_reference,
    "cli": cli_reference,
    "taxonomy": taxonomy,
}

_used: set[str] = set()


def on_pre_build(config: Any) -> None:
    _used.clear()


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    known = ", ".join(sorted(GENERATORS))
    for like in LIKE_MARKER.finditer(markdown):
        meant = difflib.SequenceMatcher(None, like.group(1).lower(), "generated").ratio() >= 0.8
        if meant and not MARKER.fullmatch(like.group(0)):
            line = markdown.count("\n", 0, like.start()) + 1
            raise PluginError(
                f"{page.file.src_uri}:{line}: {like.group(0).strip()!r} is not a marker; write "
                f"'<!-- generated: NAME -->' alone on its line from its first column (NAME: {known})"
            )

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            line = markdown.count("\n", 0, match.start()) + 1
            raise PluginError(f"{page.file.src_uri}:{line}: no generator named {name!r} (known: {known})")
        _used.add(name)
        return GENERATORS[name]()

    return MARKER.sub(fill, markdown)


def on_post_build(config: Any) -> None:
    missing = sorted(set(GENERATORS) - _used)
    if missing:
        raise PluginError(f"generated references on no page (a page lost its marker?): {missing}")
