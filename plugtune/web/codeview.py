"""The code that ran: syntax-coloured lines (pygments tokens, escaped by the template), the lines a
failure points at, and the zip behind "Download code"."""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass, field

from pygments.lexer import Lexer
from pygments.lexers import PythonLexer, TextLexer, get_lexer_for_filename
from pygments.token import Comment, Keyword, Name, Number, Operator, String, _TokenType
from pygments.util import ClassNotFound

MAX_LINES = 20_000  # a bigger file is shown as plain text, not coloured
MAX_SHOWN_BYTES = 2_000_000  # a bigger (or binary) file is offered for download only
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
# Most specific first: a token gets the class of the first kind it belongs to.
_CLASSES: list[tuple[_TokenType, str]] = [
    (Name.Decorator, "nd"),
    (Name.Function, "nf"),
    (Name.Class, "nc"),
    (Name.Builtin, "nb"),
    (Keyword, "k"),
    (String, "s"),
    (Comment, "c"),
    (Number, "m"),
    (Operator, "o"),
]

Line = list[tuple[str, str]]  # (css class or "", text)


@dataclass(frozen=True)
class CodeFile:
    path: str
    text: str
    lines: list[Line]
    marked: set[int] = field(default_factory=set)  # 1-based lines a failure traceback points at
    note: str = ""  # why the file is not shown (binary, too big)


def render_files(files: dict[str, bytes], failure_text: str = "", entry: str = "") -> list[CodeFile]:
    """Every stored file as coloured lines, the entry's file first; lines a traceback in
    ``failure_text`` points at are marked."""
    marks = failure_lines(failure_text)
    out = []
    for path, data in files.items():
        if b"\x00" in data[:8192] or len(data) > MAX_SHOWN_BYTES:
            kind = "binary" if b"\x00" in data[:8192] else "large"
            out.append(
                CodeFile(path=path, text="", lines=[], note=f"{kind} file, {len(data):,} bytes: download it")
            )
            continue
        text = data.decode("utf-8", errors="replace")
        marked = {line for name, line in marks if path == name or path.endswith(f"/{name}")}
        out.append(CodeFile(path=path, text=text, lines=colour(path, text), marked=marked))
    entry_file = entry.rpartition(":")[0].replace("\\", "/").rsplit("/", 1)[-1]
    return sorted(out, key=lambda f: not (f.path == entry_file or f.path.endswith(f"/{entry_file}")))


def failure_lines(text: str) -> list[tuple[str, int]]:
    """(file name, line) of every ``File "x.py", line N`` frame in a traceback."""
    return [(m["file"].replace("\\", "/").rsplit("/", 1)[-1], int(m["line"])) for m in _FRAME.finditer(text)]


def colour(path: str, text: str) -> list[Line]:
    lines: list[Line] = [[]]
    for token, value in _lexer(path, text).get_tokens(text):
        css = _css(token)
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                lines.append([])
            if part:
                lines[-1].append((css, part))
    if len(lines) > 1 and not lines[-1]:
        lines.pop()  # the newline that ends the file opens no line
    return lines


def _lexer(path: str, text: str) -> Lexer:
    if text.count("\n") > MAX_LINES:
        return TextLexer(stripnl=False)
    if path.endswith(".py"):
        return PythonLexer(stripnl=False, ensurenl=False)
    try:
        return get_lexer_for_filename(path, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return TextLexer(stripnl=False, ensurenl=False)


def _css(token: _TokenType) -> str:
    for kind, css in _CLASSES:
        if token in kind:
            return css
    return ""


def zip_code(files: dict[str, bytes], folder: str) -> bytes:
    """The files in one zip, under ``folder/`` so unpacking never scatters them."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            archive.writestr(f"{folder}/{_safe_member(path)}", data)
    return buffer.getvalue()


def _safe_member(path: str) -> str:
    # Paths come from the user's project; never let one climb out of the folder when unpacked.
    parts = [p for p in path.replace("\\", "/").split("/") if p not in ("", ".", "..")]
    return "/".join(parts) or "file"
