"""Poison rows in the trainer: which failed groups count against their row, the data cursor passing
over a quarantined row (deterministic, resumable), and the warning that names the file and line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.data import DataCursor
from plugtune.trainer.groups import Plugins
from plugtune.trainer.grpo import GRPOTrainer
from plugtune.trainer.model import load_model
from plugtune.trainer.poison import RowSource, observe, parse_quarantine, poison_cause
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer
from plugtune.types import ErrorRecord, TrajectoryRecord
from tests.trainer import plugins as p


def record(
    index: int, n: int, *errors: tuple[str, str], status: str = "failed", plugin: str = "exact"
) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=f"t{index}-{n}",
        group_id=f"g{index}",
        step=1,
        sample_index=index,
        rollout_index=n,
        attempt=1,
        policy_version=0,
        prompt_ids=[],
        response_ids=[],
        response_mask=[],
        response_logprobs=[],
        messages=[],
        status=status,
        errors=[
            ErrorRecord(type=t, owner="plugin", cause=c, message="boom", plugin=plugin)
            for t, c in errors
        ],
    )


PLUGIN = "Call plugin error"


def group(index: int, *errors: tuple[str, str], size: int = 2) -> list[TrajectoryRecord]:
    return [record(index, n, *errors) for n in range(size)]


def test_only_the_same_non_transient_cause_on_every_call_counts() -> None:
    assert poison_cause(group(0, (PLUGIN, "500"))) == ("exact", "500")
    assert poison_cause(group(0, (PLUGIN, "500"), (PLUGIN, "500"))) == ("exact", "500")  # every try
    for cause in ("EOF", "FaaS OOM", "Invalid reward", "Status failure"):
        assert poison_cause(group(0, (PLUGIN, cause))) == ("exact", cause)
    assert poison_cause(group(0, (PLUGIN, "Timeout"))) is None  # the machine may have been overloaded
    assert poison_cause(group(0, (PLUGIN, "Status retry"))) is None
    assert poison_cause(group(0, ("Dependency error", "server error"))) is None
    assert poison_cause(group(0, ("internal error", "Create faas fault"))) is None
    assert poison_cause(group(0, (PLUGIN, "Timeout"), (PLUGIN, "500"))) is None  # not the same on every try
    mixed = [record(0, 0, (PLUGIN, "500")), record(0, 1, (PLUGIN, "EOF"))]
    assert poison_cause(mixed) is None
    one_ok = [record(0, 0, (PLUGIN, "500")), record(0, 1, status="success")]
    assert poison_cause(one_ok) is None
    two_plugins = [record(0, 0, (PLUGIN, "500")), record(0, 1, (PLUGIN, "500"), plugin="other")]
    assert poison_cause(two_plugins) is None
    assert poison_cause([record(0, 0)]) is None  # failed with no error recorded (a stopped step)


def test_a_row_is_quarantined_after_poison_after_steps_and_named_by_file_and_line() -> None:
    cursor = DataCursor(4, seed=0)
    source = RowSource("/data/train.jsonl", [1, 2, 4, 7])  # a blank line before row 2, two before row 3
    bad = group(3, (PLUGIN, "500"))
    first = observe(cursor, 1, [bad, bad, group(1, (PLUGIN, "Timeout"))], 2, source, "12")
    assert first.warnings == [] and cursor.quarantined == frozenset()
    assert first.metrics == {
        "data/poison_groups": 2.0,
        "data/poison_calls": 4.0,
        "data/quarantined_rows": 0.0,
    }
    assert cursor.strikes == {3: ("exact\t500", (1,))}  # twice in one step counts once
    second = observe(cursor, 3, [bad], 2, source, "12")
    assert cursor.quarantined == {3}
    assert [w.key for w in second.warnings] == ["poison_row:3"]
    message = second.warnings[0].message
    assert message.startswith("Invalid data: /data/train.jsonl line 7 (row 3) is quarantined: ")
    assert "failed with 500 in exact on 2 steps (1, 3)" in message
    assert "plugtune data quarantine 12 --export clean.jsonl" in message
    found = parse_quarantine(message)
    assert found is not None
    assert found.to_dict() == {
        "file": "/data/train.jsonl",
        "line": 7,
        "row": 3,
        "cause": "500",
        "plugin": "exact",
        "steps": [1, 3],
        "trajectory_id": "t3-0",
    }
    assert second.metrics["data/quarantined_rows"] == 1.0
    assert parse_quarantine("Invalid data: something else") is None
    # once quarantined it counts no more strikes and warns no more
    assert observe(cursor, 4, [bad], 2, source).warnings == []


def test_a_different_cause_starts_the_count_again_and_zero_turns_it_off() -> None:
    cursor = DataCursor(4, seed=0)
    observe(cursor, 1, [group(2, (PLUGIN, "500"))], 2, RowSource())
    observe(cursor, 2, [group(2, (PLUGIN, "EOF"))], 2, RowSource())
    assert cursor.quarantined == frozenset() and cursor.strikes[2] == ("exact\tEOF", (2,))
    off = DataCursor(4, seed=0)
    for step in range(1, 5):
        assert observe(off, step, [group(2, (PLUGIN, "500"))], 0, RowSource()).metrics == {}
    assert off.quarantined == frozenset() and off.strikes == {}


def test_the_last_row_left_is_never_quarantined() -> None:
    cursor = DataCursor(2, seed=0)
    for step in (1, 2):
        observe(cursor, step, [group(0, (PLUGIN, "500")), group(1, (PLUGIN, "500"))], 2, RowSource())
    assert cursor.quarantined == {0}
    assert cursor.take(3) == [1, 1, 1]


def test_the_cursor_passes_over_quarantined_rows_deterministically_and_resumes() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        num_rows, batch = rng.randint(3, 9), rng.randint(1, 5)
        cursor = DataCursor(num_rows, seed)
        cursor.take(rng.randint(0, num_rows))
        cursor.quarantine(rng.randrange(num_rows))
        gone = next(iter(cursor.quarantined))
        saved = cursor.state()
        drawn = [cursor.take(batch) for _ in range(12)]
        flat = [i for b in drawn for i in b]
        assert gone not in flat
        if batch <= num_rows - 1:
            assert all(len(set(b)) == len(b) for b in drawn), (seed, drawn)  # no row twice in a batch
        # every other row is drawn about as often (once per epoch)
        counts = [flat.count(i) for i in range(num_rows) if i != gone]
        assert max(counts) - min(counts) <= 2, (seed, counts)
        resumed = DataCursor(num_rows, seed)
        resumed.restore(saved)
        assert resumed.quarantined == {gone}
        assert [resumed.take(batch) for _ in range(12)] == drawn


def test_a_checkpoint_from_before_poison_rows_restores_with_none() -> None:
    cursor = DataCursor(5, seed=3)
    cursor.take(7)
    state = cursor.state()
    assert state["quarantined"] == [] and state["strikes"] == {}
    old = {k: v for k, v in state.items() if k not in ("quarantined", "strikes")}
    resumed = DataCursor(5, seed=3)
    resumed.restore(old)
    assert resumed.take(6) == cursor.take(6)


def test_no_row_left_is_a_clear_error() -> None:
    cursor = DataCursor(1, seed=0)
    cursor.quarantine(0)
    with pytest.raises(ValueError, match="all 1 rows of the dataset are quarantined"):
        cursor.take(1)
    with pytest.raises(ValueError, match="row 5 is not a row of this dataset"):
        cursor.quarantine(5)


async def test_a_checkpoint_keeps_the_quarantined_rows_and_strikes(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """Through the trainer's own checkpoint: a resumed trainer passes over the same rows and keeps
    counting the strikes where the first left off, drawing the same prompts next."""

    def make() -> GRPOTrainer:
        lm = load_model(tiny_model_path)
        config = TrainerConfig(steps=3, batch_size=2, group_size=2, max_new_tokens=4, seed=5)
        plugins = Plugins(rollout=InProcessFunction(p.answer), graders=[InProcessFunction(p.constant)])
        server = InProcessPolicyServer(lm.model, lm.tokenizer, seed=3)
        rows = [{"messages": [{"role": "user", "content": f"{i}+{i}=?"}]} for i in range(5)]
        return GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows, config)

    first = make()
    first.cursor.quarantine(3)
    first.cursor.strike(1, 1, "exact\t500")
    result = await first.step()
    assert 3 not in {r.sample_index for r in result.records}
    assert result.metrics["data/quarantined_rows"] == 1.0 and result.metrics["data/poison_calls"] == 0.0
    saved = first.save_checkpoint(tmp_path / "checkpoint")
    second = make()
    second.load_checkpoint(saved)
    assert second.cursor.quarantined == {3}
    assert second.cursor.strikes == {1: ("exact\t500", (1,))}
    assert second.cursor.take(4) == first.cursor.take(4)
