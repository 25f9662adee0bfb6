"""Trajectory records to padded training tensors, and the policy's log-probs on them.

Each row is ``prompt_ids + response_ids``, right-padded. Position ``t`` of the ``*_BT`` tensors
scores token ``t + 1`` of the row, so a row's response tokens sit at ``[P - 1, P - 1 + R)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from plugtune.types import TrajectoryRecord


@dataclass(frozen=True)
class TrainBatch:
    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    targets_BT: torch.Tensor  # input_ids shifted left by one (T = L - 1)
    mask_BT: torch.Tensor  # 1 where the target is a policy-sampled response token
    old_logps_BT: torch.Tensor  # the gateway's sampling log-probs at those positions
    advantages_B: torch.Tensor
    trajectory_ids: list[str]

    @property
    def num_tokens(self) -> int:
        return int(self.mask_BT.sum().item())


def is_trainable(record: TrajectoryRecord) -> bool:
    """A record contributes to the loss when it has an advantage and policy tokens."""
    return record.advantage is not None and any(record.response_mask) and len(record.prompt_ids) > 0


def build_batch(records: Sequence[TrajectoryRecord], pad_id: int) -> TrainBatch:
    """Pad the trainable records into one batch (at least one record must be trainable)."""
    rows = [r for r in records if is_trainable(r)]
    if not rows:
        raise ValueError("no trainable trajectory in the batch")
    length = max(len(r.prompt_ids) + len(r.response_ids) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros((len(rows), length - 1))
    old = torch.zeros((len(rows), length - 1))
    for i, r in enumerate(rows):
        p, n = len(r.prompt_ids), len(r.response_ids)
        ids[i, : p + n] = torch.tensor(r.prompt_ids + r.response_ids, dtype=torch.long)
        attention[i, : p + n] = 1
        mask[i, p - 1 : p - 1 + n] = torch.tensor(r.response_mask, dtype=torch.float32)
        old[i, p - 1 : p - 1 + n] = torch.tensor(r.response_logprobs, dtype=torch.float32)
    advantages = torch.tensor([float(r.advantage or 0.0) for r in rows])
    return TrainBatch(
        input_ids_BL=ids,
        attention_mask_BL=attention,
        targets_BT=ids[:, 1:],
        mask_BT=mask,
        old_logps_BT=old,
        advantages_B=advantages,
        trajectory_ids=[r.trajectory_id for r in rows],
    )


def forward_logits(model: PreTrainedModel, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """Next-token logits ``[B, T, V]``, divided by the sampling temperature (as the gateway samples)."""
    out = model(input_ids=batch.input_ids_BL, attention_mask=batch.attention_mask_BL, use_cache=False)
    return out.logits[:, :-1, :].float() / temperature
