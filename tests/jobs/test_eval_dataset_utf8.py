"""A dataset line that is not UTF-8 is reported with its line, byte and column (not just the file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plugtune.errors import InvalidValueError
from plugtune.spec.rows import read_dataset
from plugtune.spec.validation import validate_job
from tests.jobs.jobkit import ROWS, make_job


def _write_rows_with_bad_line(path: Path, bad_line: int, total: int) -> None:
    lines = [json.dumps(ROWS[i % len(ROWS)]).encode() for i in range(total)]
    # "caf\xe9": Latin-1 text pasted into a UTF-8 file, 0xe9 at byte column 47 of that line
    lines[bad_line - 1] = b'{"messages": [{"role": "user", "content": "caf\xe9 au lait?"}]}'
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_invalid_utf8_on_the_last_line_names_line_byte_and_column(tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    _write_rows_with_bad_line(data, bad_line=4, total=4)
    with pytest.raises(InvalidValueError) as raised:
        read_dataset(data)
    [problem] = raised.value.problems
    assert problem.line == 4
    assert problem.message.startswith("line 4 is not UTF-8 text: byte 0xe9 at column 47")
    assert f"{data}:4: line 4 is not UTF-8 text" in str(raised.value)


def test_every_non_utf8_line_of_a_job_dataset_is_reported_before_the_job_runs(tmp_path: Path) -> None:
    job_file = make_job(tmp_path / "job")
    data = tmp_path / "job" / "data" / "train.jsonl"
    lines = data.read_bytes().splitlines()
    lines[1] = lines[1].replace(b"What", b"Wh\xffat")
    lines[4] = b"\xc3(" + lines[4]  # a two-byte sequence cut short, at column 1
    data.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InvalidValueError) as raised:
        validate_job(job_file)
    messages = {p.line: p.message for p in raised.value.problems}
    assert sorted(messages) == [2, 5]
    assert messages[2].startswith("line 2 is not UTF-8 text: byte 0xff at column 46")
    assert messages[5].startswith("line 5 is not UTF-8 text: byte 0xc3 at column 1")
    assert "(data.train in " in messages[2] and "job.yaml:" in messages[2]
