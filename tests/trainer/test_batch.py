"""Shared-prompt batching gives the same log-probs and gradients as one full forward per row."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugtune.trainer.batch import build_batch, is_trainable, policy_logits
from plugtune.trainer.losses import token_logprobs
from plugtune.trainer.model import load_model
from plugtune.types import TrajectoryRecord


def record(
    tid: str, prompt: list[int], response: list[int], mask: list[int], advantage: float | None
) -> TrajectoryRecord:
    return TrajectoryRecord(
        trajectory_id=tid, group_id="g", step=1, sample_index=0, rollout_index=0, attempt=1, policy_version=0,
        prompt_ids=prompt, response_ids=response, response_mask=mask,
        response_logprobs=[-1.0 * m for m in mask], messages=[], advantage=advantage,
    )  # fmt: skip


def test_build_batch_dedupes_prompts_and_skips_untrainable() -> None:
    a, b = [5, 6, 7], [5, 6]
    records = [
        record("t0", a, [10, 11], [1, 1], 0.5),
        record("t1", a, [12], [1], -0.5),
        record("t2", b, [13, 14, 15], [1, 0, 1], 1.0),  # a tool token in the middle
        record("t3", b, [16], [1], None),  # unscorable: no gradient
        record("t4", b, [17], [0], 1.0),  # no policy tokens
    ]
    assert [is_trainable(r) for r in records] == [True, True, True, False, False]
    batch = build_batch(records, pad_id=0)
    assert batch.trajectory_ids == ["t0", "t1", "t2"]
    assert batch.prompt_ids_GP.tolist() == [[5, 6, 7], [5, 6, 0]]
    assert batch.prompt_index_B.tolist() == [0, 0, 1]
    assert batch.response_ids_BR.tolist() == [[10, 11, 0], [12, 0, 0], [13, 14, 15]]
    assert batch.mask_BR.tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 1]]
    assert batch.old_logps_BR.tolist() == [[-1, -1, 0], [-1, 0, 0], [-1, 0, -1]]
    assert batch.advantages_B.tolist() == [0.5, -0.5, 1.0]
    assert batch.num_tokens == 5
    with pytest.raises(ValueError, match="no trainable"):
        build_batch(records[3:], pad_id=0)


@pytest.mark.parametrize("attention", ["fused", "sdpa", "eager", "rows"])
def test_shared_prompt_forward_matches_full_forward(
    tiny_model_path: Path, attention: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plugtune.trainer import batch as batch_module

    model = load_model(tiny_model_path).model
    assert batch_module.mask_kind(model) == "fused"  # a Llama: plugtune.llama_family covers it
    if attention not in (
        "fused",
        "sdpa",
    ):  # eager takes an additive 4D mask; flash attention & co. a row each
        model.config._attn_implementation = "eager"
    monkeypatch.setattr(batch_module, "mask_kind", lambda _: attention)
    g = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 90, (n,), generator=g).tolist()

    p1, p2 = ids(9), ids(4)
    records = [
        record("a", p1, ids(3), [1, 1, 1], 1.0),
        record("b", p1, ids(5), [1, 1, 0, 0, 1], -1.0),
        record("c", p2, ids(1), [1], 0.3),
        record("d", p2, ids(6), [1] * 6, -0.3),
    ]
    batch = build_batch(records, pad_id=0)
    b_N, t_N = batch.policy_positions
    assert list(zip(b_N.tolist(), t_N.tolist(), strict=True)) == [
        (b, t) for b, r in enumerate(records) for t, m in enumerate(r.response_mask) if m
    ]
    logits_NV = policy_logits(model, batch, temperature=0.7)
    shared = token_logprobs(logits_NV[None], batch.response_ids_BR[b_N, t_N][None])[0]
    loss_shared = shared.sum()
    grads_shared = torch.autograd.grad(loss_shared, list(model.parameters()))

    loss_full = torch.zeros(())
    for i, r in enumerate(records):
        seq = torch.tensor([r.prompt_ids + r.response_ids])
        logits = model(input_ids=seq, use_cache=False).logits[0, len(r.prompt_ids) - 1 : -1] / 0.7
        full = token_logprobs(logits.unsqueeze(0), torch.tensor([r.response_ids]))[0]
        sampled = torch.tensor(r.response_mask, dtype=torch.bool)
        torch.testing.assert_close(shared[b_N == i], full[sampled], rtol=1e-4, atol=1e-5)
        loss_full = loss_full + (full * torch.tensor(r.response_mask)).sum()
    grads_full = torch.autograd.grad(loss_full, list(model.parameters()))
    for a, b in zip(grads_shared, grads_full, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_micro_batches_split_by_logits_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from plugtune.trainer import batch as batch_module

    records = [record(f"t{i}", [1, 2], [3] * n, [1] * n, 1.0) for i, n in enumerate([2, 2, 4, 1, 9])]
    records.insert(2, record("skip", [1, 2], [3], [1], None))
    monkeypatch.setattr(batch_module, "LOGITS_BUDGET", 8 * 10)  # vocab 10: 8 row-positions per forward
    chunks = batch_module.micro_batches(records, pad_id=0, vocab_size=10)
    # [2, 2] fits (2 rows x 2); adding the 4 needs 3 x 4 = 12 > 8; [4, 1] is 2 x 4; the 9 goes alone
    assert [b.trajectory_ids for b in chunks] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    monkeypatch.setattr(batch_module, "LOGITS_BUDGET", 2**40)
    assert len(batch_module.micro_batches(records, pad_id=0, vocab_size=10)) == 1


def test_gradient_checkpointing_keeps_the_models_own_forward(tiny_model_path: Path) -> None:
    from plugtune.trainer import batch as batch_module

    model = load_model(tiny_model_path).model
    assert batch_module.mask_kind(model) == "fused"
    model.activation_checkpointing_enable()
    assert batch_module.mask_kind(model) == "sdpa"
