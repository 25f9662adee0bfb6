"""Where a job's files may be read from: never plugtune's own files, and for a job submitted over the
API only its submission folder and the folders the server's operator shares (``plugtune serve
--shared-dir``); which secrets such a job may import (``--secret``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from plugtune.settings import Settings


@dataclass(frozen=True)
class SubmissionPolicy:
    """What the server's operator lets a job submitted over the API use besides the files it sent:
    folders of the server it may read (``plugtune serve --shared-dir DIR``: large datasets or
    plugins kept on the server) and variables of the server's environment it may import as
    ``secrets`` (``plugtune serve --secret NAME``). By default: nothing."""

    shared_dirs: tuple[Path, ...] = ()
    secrets: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Confinement:
    """Where one submitted job may read: its submission folder ``root`` and the policy's shared
    folders; which secrets it may import. Validation applies it to every data and plugin path."""

    root: Path
    policy: SubmissionPolicy = SubmissionPolicy()

    def allows(self, path: Path) -> bool:
        """Is ``path`` (resolved: links followed) inside the submission or a shared folder?"""
        real = path.resolve()
        return any(real.is_relative_to(d.resolve()) for d in (self.root, *self.policy.shared_dirs))


def is_submission(home: Path, path: Path) -> bool:
    """Is ``path`` inside a submission folder of ``home`` (so it goes when its job is deleted)?"""
    root = (home / "submissions").resolve()
    return path.resolve().is_relative_to(root) and path.resolve() != root


def submission_root(home: Path, path: Path) -> Path:
    """The submission folder (``home/submissions/<uuid>``) that holds ``path``."""
    root = (home / "submissions").resolve()
    return root / path.resolve().relative_to(root).parts[0]


#: plugtune's folders in PLUGTUNE_HOME (each job's files, the runtime's snapshots and state, unpacked
#: submissions, support bundles); every file at the home's top (the store, serve.json, locks) is its too.
HOME_FOLDERS = frozenset({"jobs", "runtime", "submissions", "support"})


@dataclass(frozen=True)
class Reach:
    """What a job's paths may not or must reach: plugtune's own files (the SQLite store, the files
    at PLUGTUNE_HOME's top and its HOME_FOLDERS) are never read as a job's data or plugins, except
    the job's own submission folder; a job submitted over the API reads only inside its
    :class:`Confinement`."""

    job_file: Path
    home: Path
    store_file: Path | None
    confine: Confinement | None

    @classmethod
    def of(cls, job_file: Path, confine: Confinement | None) -> Reach:
        settings = Settings.from_env()
        url = settings.database_url
        store = (
            Path(url.removeprefix("sqlite:///").partition("?")[0]) if url.startswith("sqlite:///") else None
        )
        return cls(job_file.resolve(), settings.home.resolve(), store.resolve() if store else None, confine)

    def refusal(self, path: Path, what: str) -> str | None:
        """Why ``path`` may not be read as the job's ``what`` (None when it may)."""
        if self.confine is not None and not self.confine.allows(path):
            return (
                f"is outside the submitted project: a job submitted over the API reads its {what} only "
                "from the files it sent (or a folder the server's operator shares with `plugtune serve "
                "--shared-dir`); add the file to the project and name it relative to job.yaml"
            )
        if self.is_platform_file(path):
            return (
                f"is one of plugtune's own files (the store, jobs or runtime under PLUGTUNE_HOME="
                f"{self.home}): they are never read as a job's {what} (reading the store's file breaks its "
                "locks); put the file in the project's folder"
            )
        return None

    def is_platform_file(self, path: Path) -> bool:
        """Is ``path`` the store (or a hard link to it), a file at PLUGTUNE_HOME's top, or inside one
        of plugtune's folders there (other than this job's own submission)?"""
        real = path.resolve()
        if real.is_relative_to(self.home):
            own = is_submission(self.home, self.job_file)
            if own and real.is_relative_to(submission_root(self.home, self.job_file)):
                return False
            parts = real.relative_to(self.home).parts
            return len(parts) <= 1 or parts[0] in HOME_FOLDERS  # a user's project folder there is not
        if self.store_file is None:
            return False
        store = self.store_file
        if real.parent == store.parent and real.name in {
            store.name + x for x in ("", "-wal", "-shm", "-journal")
        }:
            return True
        try:
            return os.path.samefile(real, self.store_file)  # a hard link to it
        except OSError:
            return False

    def holds_home(self, folder: Path) -> bool:
        """Would a snapshot of ``folder`` copy PLUGTUNE_HOME (inside it, not under a dot folder)?"""
        real = folder.resolve()
        if not self.home.is_relative_to(real):
            return False
        return not any(part.startswith(".") for part in self.home.relative_to(real).parts)
