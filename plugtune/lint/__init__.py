"""``plugtune lint``: static checks that catch plugin failures before a job starts."""

from plugtune.lint.findings import RULES, Finding, Rule
from plugtune.lint.runner import LintReport, lint_file, lint_paths, lint_source

__all__ = ["RULES", "Finding", "LintReport", "Rule", "lint_file", "lint_paths", "lint_source"]
