"""Dataset rows: ``{"messages": [...], "tools": [...], "extra": {...}}`` per JSON line, each checked.

The same checks run before a job starts and on every row the training loop reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plugtune.errors import InvalidDataError, InvalidValueError, Problem

#: Problems reported per dataset file before the rest are summarised in one line.
MAX_PROBLEMS_PER_FILE = 50

ROW_KEYS = ("messages", "tools", "extra", "task")
#: A row's ``task``: the name of one of job.yaml's ``tasks`` (a multi-task job's plugin sets).
TASK_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
ROLES = ("system", "developer", "user", "assistant", "tool")
LAST_ROLES = ("user", "tool")


@dataclass
class Found:
    """Problems found so far, split by the error they lead to."""

    data: list[Problem] = field(default_factory=list)
    value: list[Problem] = field(default_factory=list)

    def raise_if_any(self) -> None:
        if self.data:
            raise InvalidDataError(self.data + self.value)
        if self.value:
            raise InvalidValueError(self.value)


def read_text(path: Path, name: str, found: Found, *, what: str, where: str = "") -> str | None:
    """The text of an input file, or None after recording why it cannot be used."""
    if not path.exists():
        found.data.append(Problem(name, f"{what} file does not exist{where}"))
        return None
    if not path.is_file():
        found.data.append(Problem(name, f"{what} path is not a file{where}"))
        return None
    try:
        data = path.read_bytes()
    except OSError as exc:
        found.data.append(Problem(name, f"{what} file cannot be read: {exc.strerror or exc}{where}"))
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        found.value.extend(non_utf8_lines(data, name, where))
        return None
    if not text.strip():
        found.data.append(Problem(name, f"{what} file is empty{where}"))
        return None
    return text


def non_utf8_lines(data: bytes, name: str, where: str = "") -> list[Problem]:
    """One problem per line that is not UTF-8, naming the line, the first bad byte and its column."""
    problems: list[Problem] = []
    bad_lines = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad_lines += 1
            if len(problems) < MAX_PROBLEMS_PER_FILE:
                byte, column = line[exc.start], exc.start + 1  # column in bytes, 1-based
                message = f"line {number} is not UTF-8 text: byte 0x{byte:02x} at column {column}"
                problems.append(Problem(name, message + f"; save the file as UTF-8{where}", line=number))
    if not problems:  # cannot happen (newlines never sit inside a UTF-8 sequence); never silent
        problems.append(Problem(name, f"file is not UTF-8 text; save it as UTF-8{where}"))
    if bad_lines > len(problems):
        problems.append(Problem(name, f"... and {bad_lines - len(problems)} more line(s) not UTF-8{where}"))
    return problems


def describe(value: Any) -> str:
    """A user-facing word for a value's type ("a mapping", "a list", "text", ...)."""
    return {dict: "a mapping", list: "a list", str: "text", type(None): "nothing"}.get(
        type(value), type(value).__name__
    )


def read_dataset(path: str | Path) -> list[dict[str, Any]]:
    """Every row of a JSON Lines dataset, each validated; raise with every problem found."""
    found = Found()
    name = str(path)
    text = read_text(Path(path), name, found, what="dataset")
    rows: list[dict[str, Any]] = []
    if text is not None:
        rows, found.value = parse_rows(text, name)
    found.raise_if_any()
    return rows


def dataset_lines(path: str | Path) -> list[int]:
    """The 1-based line of each row of a dataset that ``read_dataset`` reads, in its order (rows
    are its non-blank lines)."""
    text = Path(path).read_bytes().decode("utf-8")
    return [number for number, line in enumerate(text.splitlines(), start=1) if line.strip()]


def parse_rows(text: str, name: str) -> tuple[list[dict[str, Any]], list[Problem]]:
    rows: list[dict[str, Any]] = []
    problems: list[Problem] = []
    bad_rows = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            row_problems = [Problem(name, f"not valid JSON: {exc.msg} (column {exc.colno})", line=number)]
        else:
            row_problems = validate_row(row, name, number)
        if row_problems:
            bad_rows += 1
            if len(problems) < MAX_PROBLEMS_PER_FILE:
                problems.extend(row_problems[: MAX_PROBLEMS_PER_FILE - len(problems)])
        else:
            rows.append(row)
    shown = {p.line for p in problems}
    hidden = bad_rows - len(shown)
    if hidden > 0:
        problems.append(Problem(name, f"... and {hidden} more invalid row(s) not listed"))
    if not rows and not problems:
        problems.append(Problem(name, "dataset has no rows"))
    return rows, problems


def validate_row(row: Any, file: str, line: int | None) -> list[Problem]:
    """Problems of one dataset row ``{"messages": [...], "tools": [...], "extra": {...}}`` ([] if fine)."""

    def problem(message: str, where: str | None = None) -> Problem:
        return Problem(file, message, line=line, field=where)

    if not isinstance(row, dict):
        return [problem(f'a row must be a JSON object {{"messages": [...]}}, got {describe(row)}')]
    out = [problem(f"unknown key; allowed: {', '.join(ROW_KEYS)}", str(k)) for k in row if k not in ROW_KEYS]
    if "messages" not in row:
        out.append(problem("required key is missing", "messages"))
    else:
        out.extend(_message_problems(row["messages"], problem))
    tools = row.get("tools", [])
    if tools is not None and not isinstance(tools, list):
        out.append(problem(f"must be a list of tool definitions, got {describe(tools)}", "tools"))
    else:
        for index, tool in enumerate(tools or []):
            out.extend(_tool_problems(tool, f"tools[{index}]", problem))
    extra = row.get("extra", {})
    if extra is not None and not isinstance(extra, dict):
        out.append(problem(f"must be an object, got {describe(extra)}", "extra"))
    task = row.get("task")
    if "task" in row and not (isinstance(task, str) and TASK_PATTERN.fullmatch(task)):
        out.append(
            problem(
                f"must be a task name of job.yaml's tasks (letters, digits, _ . -; at most 64), got "
                f"{_shown(task)}",
                "task",
            )
        )
    return out


def _shown(value: Any, limit: int = 80) -> str:
    """A row's value as an error message quotes it: ``repr``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 20]}... ({len(text)} characters)"


def _listed(names: Sequence[str], limit: int = 20) -> str:
    """Names for an error message: the first ``limit``, then how many more."""
    shown = ", ".join(names[:limit]) or "none"
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def task_problems(text: str, name: str, known: Collection[str], where: str = "") -> list[Problem]:
    """One problem per row (by line) whose ``task`` names no plugin set: none of ``known`` (job.yaml's
    tasks and ``default``, the top-level plugins)."""
    problems: list[Problem] = []
    bad = 0
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # parse_rows reports it
        if not isinstance(row, dict):
            continue
        task = row.get("task", "default")
        if not isinstance(task, str) or not TASK_PATTERN.fullmatch(task) or task in known:
            continue
        bad += 1
        if len(problems) < MAX_PROBLEMS_PER_FILE:
            sets = _listed(sorted(set(known) - {"default"}))
            if "task" not in row or task == "default":
                what = "names no task"
                if "task" in row:
                    what = "names the task 'default' (the top-level plugins)"
                message = (
                    f"the row {what}, and job.yaml's plugins have no grader to score it (a multi-task "
                    f"job without a default plugin set): give it a task: (one of {sets}), or add graders "
                    f"to plugins{where}"
                )
            else:
                default = (
                    " (and default: the top-level plugins, for rows without task)"
                    if "default" in known
                    else ""
                )
                message = (
                    f"task {task!r} has no plugin set: job.yaml's tasks are {sets}{default}; "
                    f"add tasks.{task} to job.yaml, or fix the row's task{where}"
                )
            problems.append(Problem(name, message, line=number, field="task"))
    if bad > len(problems):
        problems.append(
            Problem(name, f"... and {bad - len(problems)} more row(s) whose task has no plugin set")
        )
    return problems


def _message_problems(messages: Any, problem: Any) -> list[Problem]:
    if not isinstance(messages, list) or not messages:
        return [
            problem(
                f"must be a non-empty list of {{role, content}} objects, got {describe(messages)}", "messages"
            )
        ]
    out: list[Problem] = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            out.append(problem(f"must be a {{role, content}} object, got {describe(message)}", where))
            continue
        role = message.get("role")
        if role not in ROLES:
            out.append(problem(f"role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role"))
        if "content" not in message and not (role == "assistant" and message.get("tool_calls")):
            out.append(problem("required key is missing", f"{where}.content"))
        elif message.get("content") is not None and not isinstance(message["content"], (str, list)):
            out.append(
                problem(
                    f"must be text or a list of content parts, got {describe(message['content'])}",
                    f"{where}.content",
                )
            )
    last = messages[-1]
    if isinstance(last, dict) and last.get("role") in ROLES and last.get("role") not in LAST_ROLES:
        out.append(
            problem(
                f"the last message must be from user or tool (the policy answers it), not {last['role']!r}",
                f"messages[{len(messages) - 1}].role",
            )
        )
    return out


def _tool_problems(tool: Any, where: str, problem: Any) -> list[Problem]:
    if not isinstance(tool, dict):
        return [problem(f"must be an object, got {describe(tool)}", where)]
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, dict):
        return [
            problem(
                'must look like {"type": "function", "function": {"name": ..., "parameters": ...}}', where
            )
        ]
    if not isinstance(function.get("name"), str) or not function["name"]:
        return [problem("required key is missing or not text", f"{where}.function.name")]
    return []
