"""The code view: colouring, the lines a traceback points at, file order and the zip."""

from __future__ import annotations

import io
import zipfile

from plugtune.web.codeview import colour, failure_lines, render_files, zip_code


def test_colouring_keeps_every_character_on_its_line() -> None:
    text = 'import os\n@grader()\ndef f(x):\n    """doc\n    more"""\n    return 1  # <b>\n'
    lines = colour("g.py", text)
    assert ["".join(part for _, part in line) for line in lines] == text.splitlines()
    assert ("k", "def") in lines[2] and ("nf", "f") in lines[2] and ("nd", "@grader") in lines[1]
    assert ("c", "# <b>") in lines[5]  # raw here; the template escapes it


def test_traceback_frames_mark_lines_of_the_matching_file_only() -> None:
    traceback = 'Traceback:\n  File "/snap/plugins/grader.py", line 2, in exact\n  File "other.py", line 1'
    assert failure_lines(traceback) == [("grader.py", 2), ("other.py", 1)]
    files = {"plugins/grader.py": b"a\nb\n", "my_grader.py": b"a\nb\n", "rollout.py": b"x\n"}
    shown = {f.path: f.marked for f in render_files(files, traceback, "/abs/plugins/rollout.py:solve")}
    assert shown == {"rollout.py": set(), "plugins/grader.py": {2}, "my_grader.py": set()}
    assert [f.path for f in render_files(files, "", "/abs/plugins/rollout.py:solve")][0] == "rollout.py"


def test_zip_never_lets_a_path_climb_out_of_its_folder() -> None:
    data = zip_code({"../../etc/passwd": b"x", "plugins/a.py": b"y"}, "exact-abc")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        assert archive.namelist() == ["exact-abc/etc/passwd", "exact-abc/plugins/a.py"]


def test_binary_files_are_offered_for_download_not_shown() -> None:
    shown = render_files({"native.so": b"\x7fELF\x00\x01", "a.py": b"x = 1\n"})
    assert shown[0].path == "native.so" and shown[0].lines == [] and "binary file, 6 bytes" in shown[0].note
    assert shown[1].lines == [[("", "x"), ("", " "), ("o", "="), ("", " "), ("m", "1")]]
