"""A job's project sent over the API: packed by ``plugtune submit --server``, unpacked by the server.

The server writes each submission into its own folder, ``$PLUGTUNE_HOME/submissions/<uuid>/``, and
accepts nothing that could land outside it: no absolute paths or ``..``, no links, no devices, and
bounded sizes (checked as the bytes are written, not as an archive's headers claim). A tar archive's
headers are walked and bounded before ``tarfile`` reads them (each pax or GNU long-name header, their
number and total, the data they announce), so a small upload cannot make the server decompress or
hold gigabytes of headers. Every refusal is a :class:`SubmissionError` whose problems name the file
and say what to do.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
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
from plugtune.home import private_dir

MAX_UPLOAD_BYTES = 32 << 20  # a whole POST /api/jobs body: the archive (or files) and job.yaml
MAX_UNPACKED_BYTES = 256 << 20  # what an archive may unpack to
MAX_FILES = 2000
MAX_PATH_CHARS = 512
MAX_HEADER_BYTES = 64 << 10  # one tar pax / GNU long-name header's data
MAX_HEADERS = 3 * MAX_FILES + 16  # tar headers of all kinds (a member may have a pax and a long-name one)
MAX_HEADERS_TOTAL = 4 << 20  # all pax / GNU long-name headers' data together
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
    """A fresh, empty submission folder under ``home/submissions``, owner-only (another team's code
    and data: no other user of this machine, plugins' uids included, reads it)."""
    return private_dir(home / "submissions" / uuid.uuid4().hex)


def unpack(data: bytes, folder: Path, *, name: str = "project") -> None:
    """Unpack a .zip or .tar(.gz) archive into ``folder``; a single top folder holding everything
    (``zip -r my-task.zip my-task``) is taken as the project itself."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        check_zip_directory(data, name)
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
        check_tar_headers(data, name)
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


MAX_ZIP_DIRECTORY = MAX_FILES * (46 + MAX_PATH_CHARS + 1024)  # entries, names, some extra fields
_ZIP_END, _ZIP_ENTRY = b"PK\x05\x06", b"PK\x01\x02"


def check_zip_directory(data: bytes, name: str) -> None:
    """Refuse a zip whose central directory is larger than MAX_ZIP_DIRECTORY bytes or lists more
    than MAX_FILES entries (counted here, not taken from the archive's own count) before ``zipfile``
    parses every entry of it (300,000 empty entries in 25 MB cost it 8 s of CPU); a zip64
    directory, which a project never needs, is refused too."""
    end = data.rfind(_ZIP_END, max(0, len(data) - (1 << 16) - 22))
    if end < 0 or len(data) < end + 22:
        return  # zipfile reports it
    entries = int.from_bytes(data[end + 10 : end + 12], "little")
    size = int.from_bytes(data[end + 12 : end + 16], "little")
    if entries == 0xFFFF or size == 0xFFFFFFFF:
        raise SubmissionError([_header_problem(name, "is a zip64 archive, which a project never needs")])
    if size > MAX_ZIP_DIRECTORY:
        what = f"has a {size}-byte directory (at most {MAX_ZIP_DIRECTORY} bytes)"
        raise SubmissionError([_header_problem(name, what)])
    pos, count = end - size, 0
    while 0 <= pos < end and data[pos : pos + 4] == _ZIP_ENTRY:
        count += 1
        if count > MAX_FILES:
            raise SubmissionError([_too_many(name, count, "project")])
        lengths = [int.from_bytes(data[pos + i : pos + i + 2], "little") for i in (28, 30, 32)]
        pos += 46 + sum(lengths)


TAR_BLOCK = 512
_META_TYPES = (b"x", b"g", b"X", b"L", b"K")  # pax (extended, global, Solaris) and GNU long name / link
_DATA_FREE_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, folders, FIFOs: no data
_PAX_RECORD = re.compile(rb"(\d+) ")


def check_tar_headers(data: bytes, name: str) -> None:
    """Walk a tar archive's headers (decompressing as needed) and refuse one whose headers are out of
    bounds: a pax or GNU long-name header over MAX_HEADER_BYTES, more than MAX_HEADERS headers, more
    than MAX_HEADERS_TOTAL bytes of them, sparse files, or members announcing more than
    MAX_UNPACKED_BYTES; data is skipped unread as far as the compression allows. What is not a tar
    (or is damaged) is left to ``tarfile``, which reports it."""
    try:
        with _decompressed(data) as stream:
            _walk_headers(stream, name)
    except SubmissionError:
        raise
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError):
        return  # not an archive we can walk: tarfile says why


def _decompressed(data: bytes) -> io.BufferedIOBase:
    raw = io.BytesIO(data)
    if data.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw)
    if data.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if data.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


def _walk_headers(stream: io.BufferedIOBase, name: str) -> None:
    headers = meta = announced = 0
    pax_size: int | None = None
    while True:
        block = stream.read(TAR_BLOCK)
        if len(block) < TAR_BLOCK or not block.strip(b"\0"):
            return  # the end (or a truncated archive, which tarfile reports)
        headers += 1
        if headers > MAX_HEADERS:
            raise SubmissionError([_header_problem(name, f"holds more than {MAX_HEADERS} tar headers")])
        kind, size = block[156:157], _tar_number(block[124:136])
        if kind == b"S":
            raise SubmissionError([_header_problem(name, "holds a sparse file")])
        if kind in _META_TYPES:
            meta += size
            if size > MAX_HEADER_BYTES:
                what = f"holds a {size}-byte pax or long-name header (at most {MAX_HEADER_BYTES})"
                raise SubmissionError([_header_problem(name, what)])
            if meta > MAX_HEADERS_TOTAL:
                what = f"holds more than {MAX_HEADERS_TOTAL} bytes of pax and long-name headers"
                raise SubmissionError([_header_problem(name, what)])
            content = stream.read(_padded(size))[:size]
            if kind == b"x" or kind == b"X":
                pax_size = _pax_size(content, name)
            continue
        if kind not in _DATA_FREE_TYPES:
            size = pax_size if pax_size is not None else size
            announced += size
            if announced > MAX_UNPACKED_BYTES:
                raise SubmissionError([_too_big(name, MAX_UNPACKED_BYTES, "its headers", "project")])
            _skip(stream, _padded(size))
        pax_size = None


def _tar_number(field: bytes) -> int:
    """A tar header's numeric field: octal text, or base-256 when its first byte has the high bit."""
    if field[:1] in (b"\x80", b"\xff"):
        value = int.from_bytes(field[1:], "big")
        return value if field[:1] == b"\x80" else value - (256 ** (len(field) - 1))
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _pax_size(content: bytes, name: str) -> int | None:
    """The ``size`` a pax header sets for the next member; a sparse-file record is refused."""
    size, pos = None, 0
    while pos < len(content):
        match = _PAX_RECORD.match(content, pos)
        if match is None or int(match[1]) <= 0:
            return size  # malformed: tarfile reports it
        record = content[match.end() : pos + int(match[1])].rstrip(b"\n")
        key, _, value = record.partition(b"=")
        if key.startswith(b"GNU.sparse"):
            raise SubmissionError([_header_problem(name, "holds a sparse file")])
        if key == b"size" and value.isdigit():
            size = int(value)
        pos += int(match[1])
    return size


def _padded(size: int) -> int:
    return -(-size // TAR_BLOCK) * TAR_BLOCK


def _skip(stream: io.BufferedIOBase, count: int) -> None:
    while count > 0:
        chunk = stream.read(min(count, CHUNK))
        if not chunk:
            return
        count -= len(chunk)


def _header_problem(name: str, what: str) -> Problem:
    return Problem(
        name,
        f"{what}; a project archive is a plain one: pack it again with "
        "`tar czf project.tar.gz -C my-task .` or `plugtune submit --server URL job.yaml`",
        field="project",
    )


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
                    "large data in a folder the server shares (`plugtune serve --shared-dir`) and name it "
                    "by its absolute path in job.yaml",
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
        f"unpacks to more than {limit} bytes (at {entry!r}); keep large data in a folder the server "
        "shares (`plugtune serve --shared-dir`) and name it by its absolute path in job.yaml",
        field=field,
    )


def _link(name: str, entry: str) -> Problem:
    return Problem(
        f"{name}: {entry[:200]!r}",
        "is a symbolic or hard link; links are refused (they could point outside the project): "
        "replace it by the file it points to",
        field="project",
    )
