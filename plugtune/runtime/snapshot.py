"""Code snapshots: a plugin's code root (the file's folder), stored by content hash.

The instances run from the snapshot, so what ``Function.code()`` shows is exactly what ran.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "node_modules", ".mypy_cache", ".pytest_cache"}
MAX_FILES = 2_000
MAX_BYTES = 64 << 20


class SnapshotError(Exception):
    """The code root cannot be snapshotted (missing file, too large); the message says what to do."""


@dataclass(frozen=True)
class CodeSnapshot:
    code_hash: str  # sha256 over (relative path, content) of every file
    root: Path  # the stored copy
    relpath: str  # the plugin module inside it

    def files(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for path in sorted(self.root.rglob("*")):
            if path.is_file():
                out[path.relative_to(self.root).as_posix()] = path.read_bytes()
        return out


def collect(code_root: Path) -> dict[str, bytes]:
    """Every regular file under ``code_root``; a symlink counts as its target when that is inside too.

    A hard link (a file with more than one name) owned by someone other than the folder's owner is
    refused: its other name may be a file the folder's owner cannot read (made where hard links to
    others' files are allowed), and the snapshot is read by the plugin."""
    files: dict[str, bytes] = {}
    total = 0
    seen: set[Path] = set()
    owner = code_root.stat().st_uid
    for dirpath, dirnames, filenames in os.walk(code_root, followlinks=True):
        real = Path(dirpath).resolve()
        if real in seen:  # a link back to a folder already walked
            dirnames[:] = []
            continue
        seen.add(real)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and not d.startswith(".") and _inside(Path(dirpath) / d, code_root)
        )
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            if not _inside(path, code_root) or not path.is_file():
                continue  # not a regular file (a socket, a fifo, a dangling link)
            data = _read_own(path, owner)
            total += len(data)
            files[path.relative_to(code_root).as_posix()] = data
            if len(files) > MAX_FILES or total > MAX_BYTES:
                raise SnapshotError(
                    f"{code_root}: the plugin's folder holds more than {MAX_FILES} files or "
                    f"{MAX_BYTES >> 20} MiB; put the plugin in its own folder and keep data files elsewhere"
                )
    return files


def _read_own(path: Path, owner: int) -> bytes:
    """The bytes of regular file ``path`` (checked on the opened file, so a swap cannot slip by);
    SnapshotError for a hard link owned by another user than ``owner``."""
    fd = os.open(path.resolve(), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as stream:
        info = os.fstat(fd)
        if info.st_nlink > 1 and info.st_uid != owner:
            raise SnapshotError(
                f"{path}: is a hard link to a file of user {info.st_uid} (the plugin's folder belongs to "
                f"user {owner}); a snapshot copies only the folder owner's own files, and its plugins can "
                "read them: copy the file instead of linking it (cp, not ln), or remove it"
            )
        if not stat.S_ISREG(info.st_mode):
            raise SnapshotError(f"{path}: is not a regular file; remove it from the plugin's folder")
        return stream.read()


def _inside(path: Path, code_root: Path) -> bool:
    """True for a path whose target is inside ``code_root``; a symlink out of it is refused."""
    if not path.is_symlink():
        return True
    target = path.resolve()
    if target == code_root or code_root in target.parents:
        return True
    raise SnapshotError(
        f"{path}: is a symlink to {target}, outside the plugin's folder {code_root}; a snapshot holds "
        "only the folder's own files: copy what the plugin needs into the folder, or remove the link"
    )


def content_hash(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for rel in sorted(files):
        data = files[rel]
        digest.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        digest.update(data)
    return digest.hexdigest()


def take(file: Path, state_dir: Path) -> CodeSnapshot:
    """Snapshot ``file``'s folder into ``state_dir/code/<hash>`` (reused when it is already there)."""
    if not file.exists():
        raise SnapshotError(f"{file}: no such file")
    if not file.is_file() or file.suffix != ".py":
        raise SnapshotError(f"{file}: a plugin entry must be a .py file")
    code_root = file.parent.resolve()
    files = collect(code_root)
    code_hash = content_hash(files)
    target = state_dir / "code" / code_hash
    relpath = file.resolve().relative_to(code_root).as_posix()
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
        for rel, data in files.items():
            dest = staging / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        try:
            staging.rename(target)
        except OSError:  # another deploy stored the same code first
            shutil.rmtree(staging, ignore_errors=True)
    return CodeSnapshot(code_hash=code_hash, root=target, relpath=relpath)
