"""``Finding``: one problem ``plugtune lint`` reports, and the rules it can come from."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

ASYNC_FIX = "or drop `async` so the runtime runs the function in threads"


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    fix: str


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "PT000",
            "syntax-error",
            "fix the syntax error: the runtime cannot import this file (Create faas fault)",
        ),
        Rule("PT101", "blocking-call", f"use the async API, {ASYNC_FIX}"),
        Rule("PT201", "grader-nan", "return a finite float, or None when the trajectory cannot be scored"),
        Rule(
            "PT202",
            "grader-division",
            "check the denominator first and return None (unscorable) when it is 0",
        ),
        Rule(
            "PT203",
            "grader-implicit-none",
            "end every path with `return <float>`, or `return None` on purpose",
        ),
        Rule(
            "PT204",
            "grader-non-number",
            "return a float, None or GraderResult (a list of floats only from a @group_grader)",
        ),
        Rule(
            "PT301",
            "swallowed-exception",
            "catch the specific exception and let the rest raise: the call is retried and reported, "
            "never scored as 0",
        ),
        Rule(
            "PT302",
            "process-exit",
            "raise an exception instead: exiting kills the instance and the call fails as EOF",
        ),
        Rule(
            "PT401", "missing-decorator", "decorate it: `from plugtune import rollout, grader, group_grader`"
        ),
        Rule("PT402", "bad-plugin-signature", "use the documented signature; the runtime rejects this one"),
        Rule("PT403", "wrong-plugin-kind", "use the decorator that matches its place in job.yaml"),
        Rule(
            "PT404",
            "duplicate-plugin-name",
            "give one of the two entries in job.yaml its own `name:` (rewards, metrics and logs are "
            "kept by name)",
        ),
        Rule(
            "PT405",
            "foreign-reward-function",
            "keep the function and call it from a @grader that scores one trajectory",
        ),
    )
}


@dataclass(frozen=True)
class Finding:
    """One problem at ``file:line:col``, the rule it breaks and a one-line fix."""

    file: str
    line: int
    col: int
    rule: str
    message: str
    fix: str

    @property
    def name(self) -> str:
        return RULES[self.rule].name

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        return f"{where}: {self.rule} [{self.name}] {self.message}\n    fix: {self.fix}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "name": self.name}


def finding(file: str, node: Any, rule: str, message: str, fix: str | None = None) -> Finding:
    """A finding at ``node``'s position (an AST node, or a line number)."""
    line = node if isinstance(node, int) else getattr(node, "lineno", 1)
    col = 1 if isinstance(node, int) else getattr(node, "col_offset", 0) + 1
    return Finding(file, line, col, rule, message, fix or RULES[rule].fix)
