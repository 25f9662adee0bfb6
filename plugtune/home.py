"""What plugtune writes in ``$PLUGTUNE_HOME`` is its owner's alone: owner-only folders and files.

Plugins run as other users of this machine (a uid per function when plugtune runs as root), so a
job's folder (``jobs/N``: checkpoints, ``final/``, TensorBoard), the store file, submissions and
support bundles are created owner-only from the start, not only when the runtime later closes the
home (``runtime.sandbox.protect_state``). Two tools, used together:

- :func:`private_dir` at each place plugtune makes such a folder (the mechanism does not depend on
  who started the process);
- :func:`owner_only_files` (umask 077) around the processes that own a home (``run``, ``serve``,
  ``submit``, ``demo``, every attempt), for what libraries write inside those folders
  (``save_pretrained``, TensorBoard, SQLite's -wal/-shm). The runtime opens what plugins must reach
  (the state dir's traversal bits, a snapshot granted to its group) with explicit modes, which a
  umask does not change.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

OWNER_ONLY_UMASK = 0o077


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents owner-only (0700, whatever the umask); return it.

    Folders that exist already keep their mode (the home's is the runtime's to set)."""
    missing = []
    for folder in [path, *path.parents]:
        if folder.exists():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made by another process at the same moment
            continue
        folder.chmod(0o700)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty and owner-only (0600) when it does not exist; return it."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass
    return path


@contextmanager
def owner_only_files() -> Iterator[None]:
    """While inside, what this process (and the children it starts) creates is owner-only."""
    previous = os.umask(OWNER_ONLY_UMASK)
    try:
        yield
    finally:
        os.umask(previous)
