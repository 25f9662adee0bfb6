"""A job's project sent over the API: packed by ``plugtune submit --server``, unpacked by the server.

The server writes each submission into its own folder, ``$PLUGTUNE_HOME/submissions/<uuid>/``, and
accepts nothing that could land outside it: no absolute paths or ``..``, no links, no devices, and
bounded sizes (checked as the bytes are written, not as an archive's headers claim). Every refusal
is a :class:`SubmissionError` whose problems name the file and say what to do.
"""

from __future__ import annotations

import io
import shutil
import stat
import tarfile
import uuid
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from plugtune.errors import Problem

MAX_UPLOAD_BYTES = 32 << 20  # a whole POST /api/jobs body: the archive (or files) and job.yaml
MAX_UNPACKED_BYTES = 256 << 20  # what an archive may unpack to
MAX_FILES = 2000
MAX_PATH_CHARS = 512
SKIPPED = frozenset({".plugtune", ".venv", "__pycache__", ".git"})  # never packed
CHUNK = 1 << 16


class SubmissionError(ValueError):
    """Raised when an uploaded project cannot be used as sent; ``problems`` name each file."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class Upload:
    """One uploaded file: its path inside the project (as the client named it) and its bytes."""

    path: str
    data: bytes


def new_folder(home: Path) -> Path:
    """A fresh, empty submission folder under ``home/submissions``."""
    folder = home / "submissions" / uuid.uuid4().hex
    folder.mkdir(parents=True)
    return folder


def is_submission(home: Path, path: Path) -> bool:
    """Is ``path`` inside a submission folder of ``home`` (so it goes when its job is deleted)?"""
    root = (home / "submissions").resolve()
    return path.resolve().is_relative_to(root) and path.resolve() != root


def submission_root(home: Path, path: Path) -> Path:
    """The submission folder (``home/submissions/<uuid>``) that holds ``path``."""
    root = (home / "submissions").resolve()
    return root / path.resolve().relative_to(root).parts[0]


def unpack(data: bytes, folder: Path, *, name: str = "project") -> None:
    """Unpack a .zip or .tar(.gz) archive into ``folder``; a single top folder holding everything
    (``zip -r my-task.zip my-task``) is taken as the project itself."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                _write_all(folder, _zip_members(archive, name), name, "project")
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError) as exc:
            raise SubmissionError(
                [
                    Problem(
                        name,
                        f"is a damaged or unsupported zip archive ({exc}); pack it again",
                        field="project",
                    )
                ]
            ) from None
        return
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            _write_all(folder, _tar_members(archive, name), name, "project")
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise SubmissionError(
            [
                Problem(
                    name,
                    f"is not a .zip or .tar.gz archive ({exc}); send the job's folder packed with "
                    "`tar czf project.tar.gz -C my-task .` or `plugtune submit --server URL job.yaml`",
                    field="project",
                )
            ]
        ) from None


def write_files(files: Iterable[Upload], folder: Path) -> None:
    """Write loose uploaded files (the console's folder pick) under ``folder``, with the archive's rules."""
    members = ((f.path, io.BytesIO(f.data)) for f in files)
    _write_all(folder, members, "project_files", "project_files")


def write_spec(folder: Path, text: str) -> Path:
    """Write job.yaml's text into the submission folder (replacing an archive's job.yaml)."""
    path = folder / "job.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def pack(root: Path) -> bytes:
    """The project folder ``root`` as a .tar.gz, without .plugtune/, .venv/, __pycache__/, .git/ and
    links; SubmissionError when it is larger than a server accepts."""
    buffer = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in _project_files(root):
            size += path.stat().st_size
            if size > MAX_UNPACKED_BYTES:
                raise SubmissionError([_too_big(str(root), MAX_UNPACKED_BYTES, str(path), "project")])
            archive.add(path, arcname=path.relative_to(root).as_posix(), recursive=False)
    data = buffer.getvalue()
    if len(data) > MAX_UPLOAD_BYTES:
        raise SubmissionError(
            [
                Problem(
                    str(root),
                    f"packs to {len(data)} bytes; a server accepts at most {MAX_UPLOAD_BYTES}: keep "
                    "large data on the server and name it by an absolute path in job.yaml",
                    field="project",
                )
            ]
        )
    return data


def _project_files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if SKIPPED.intersection(relative.parts) or path.is_symlink() or not path.is_file():
            continue
        yield path


def _zip_members(archive: zipfile.ZipFile, name: str) -> Iterator[tuple[str, IO[bytes] | None]]:
    infos = archive.infolist()
    if len(infos) > MAX_FILES:
        raise SubmissionError([_too_many(name, len(infos), "project")])
    for info in infos:
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise SubmissionError([_link(name, info.filename)])
        if info.is_dir():
            yield info.filename, None
            continue
        with archive.open(info) as stream:
            yield info.filename, stream


def _tar_members(archive: tarfile.TarFile, name: str) -> Iterator[tuple[str, IO[bytes] | None]]:
    count = 0
    for member in archive:
        count += 1
        if count > MAX_FILES:
            raise SubmissionError([_too_many(name, count, "project")])
        if member.issym() or member.islnk():
            raise SubmissionError([_link(name, member.name)])
        if member.isdir():
            yield member.name, None
        elif member.isfile():
            yield member.name, archive.extractfile(member)
        else:
            raise SubmissionError(
                [
                    Problem(
                        name,
                        f"{member.name!r} is a device, FIFO or other special file; send regular files only",
                        field="project",
                    )
                ]
            )


def _write_all(folder: Path, members: Iterable[tuple[str, IO[bytes] | None]], name: str, field: str) -> None:
    """Write members (path, stream or None for a folder) under ``folder``, checking every path and
    the bytes written; then lift a lone top folder that holds job.yaml up to ``folder``."""
    written = 0
    count = 0
    root = folder.resolve()
    for raw, stream in members:
        relative = safe_path(raw, name, field)
        if relative is None:
            continue
        count += 1
        if count > MAX_FILES:
            raise SubmissionError([_too_many(name, count, field)])
        target = root.joinpath(*relative.parts)
        try:
            if stream is None:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as out:
                while chunk := stream.read(CHUNK):
                    written += len(chunk)
                    if written > MAX_UNPACKED_BYTES:
                        raise SubmissionError([_too_big(name, MAX_UNPACKED_BYTES, raw, field)])
                    out.write(chunk)
        except OSError as exc:  # a path that is a file in one entry and a folder in another
            raise SubmissionError(
                [
                    Problem(
                        f"{name}: {raw[:200]!r}",
                        f"cannot be written ({exc.strerror}): two entries "
                        "clash (a file and a folder of one name?)",
                        field=field,
                    )
                ]
            ) from None
    _lift_single_top(root)


def safe_path(raw: str, name: str, field: str = "project") -> PurePosixPath | None:
    """``raw`` as a relative path inside the project, or SubmissionError when it could leave it;
    None for an entry that names the project folder itself (``./``)."""
    cleaned = raw.replace("\\", "/")
    where = f"{name}: {raw[:200]!r}"
    if "\x00" in cleaned or len(cleaned) > MAX_PATH_CHARS:
        raise SubmissionError(
            [Problem(where, "is not a usable file name (NUL byte or too long)", field=field)]
        )
    if cleaned.startswith("/") or (len(cleaned) > 1 and cleaned[1] == ":"):
        raise SubmissionError(
            [
                Problem(
                    where,
                    "is an absolute path; an archive's paths must be relative to the project folder",
                    field=field,
                )
            ]
        )
    parts = [p for p in cleaned.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise SubmissionError(
            [
                Problem(
                    where,
                    "has a '..' segment and would land outside the project folder; pack the folder itself",
                    field=field,
                )
            ]
        )
    if SKIPPED.intersection(parts[:-1]) or (parts and parts[-1] in SKIPPED):
        return None
    return PurePosixPath(*parts) if parts else None


def _lift_single_top(root: Path) -> None:
    entries = list(root.iterdir())
    if len(entries) != 1 or not (entries[0] / "job.yaml").is_file():
        return
    top = entries[0]
    for child in list(top.iterdir()):
        shutil.move(str(child), str(root / child.name))
    top.rmdir()


def _too_many(name: str, count: int, field: str) -> Problem:
    return Problem(name, f"holds {count} or more entries; at most {MAX_FILES} are accepted", field=field)


def _too_big(name: str, limit: int, entry: str, field: str) -> Problem:
    return Problem(
        name,
        f"unpacks to more than {limit} bytes (at {entry!r}); keep large data on the server and name it "
        "by an absolute path in job.yaml",
        field=field,
    )


def _link(name: str, entry: str) -> Problem:
    return Problem(
        f"{name}: {entry[:200]!r}",
        "is a symbolic or hard link; links are refused (they could point outside the project): "
        "replace it by the file it points to",
        field="project",
    )
