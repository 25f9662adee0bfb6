"""Trajectory records to training tensors, and the policy's logits on their responses.

The rollouts of a GRPO group start from the same prompt, so each distinct prompt is run through
the model once and its key/value cache is shared by every response that continues it
(gradients flow back through the shared cache). Responses are right-padded; position ``t`` of
the ``*_BR`` tensors is response token ``t``. Prompts are right-padded too, so no attention row
is ever fully masked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from plugtune.types import TrajectoryRecord

#: transformers renamed ``past_key_values`` to ``cache``; use whichever this version has.
CACHE_KWARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


@dataclass(frozen=True)
class TrainBatch:
    prompt_ids_GP: torch.Tensor  # distinct prompts, right-padded
    prompt_attention_GP: torch.Tensor
    prompt_index_B: torch.Tensor  # which prompt each response continues
    response_ids_BR: torch.Tensor  # right-padded; also the targets
    response_attention_BR: torch.Tensor
    mask_BR: torch.Tensor  # 1 where the token was sampled by the policy
    old_logps_BR: torch.Tensor  # the gateway's sampling log-probs
    advantages_B: torch.Tensor
    trajectory_ids: list[str]

    @property
    def num_tokens(self) -> int:
        return int(self.mask_BR.sum().item())


def is_trainable(record: TrajectoryRecord) -> bool:
    """A record contributes to the loss when it has an advantage, a prompt and policy tokens."""
    return record.advantage is not None and any(record.response_mask) and len(record.prompt_ids) > 0


def build_batch(records: Sequence[TrajectoryRecord], pad_id: int) -> TrainBatch:
    """Pad the trainable records into one batch (at least one record must be trainable)."""
    rows = [r for r in records if is_trainable(r)]
    if not rows:
        raise ValueError("no trainable trajectory in the batch")
    prompts: dict[tuple[int, ...], int] = {}
    for r in rows:
        prompts.setdefault(tuple(r.prompt_ids), len(prompts))
    prompt_ids, prompt_attention = _right_pad([list(p) for p in prompts], pad_id)
    response_ids, response_attention = _right_pad([r.response_ids for r in rows], pad_id)
    width = response_ids.shape[1]
    return TrainBatch(
        prompt_ids_GP=prompt_ids,
        prompt_attention_GP=prompt_attention,
        prompt_index_B=torch.tensor([prompts[tuple(r.prompt_ids)] for r in rows], dtype=torch.long),
        response_ids_BR=response_ids,
        response_attention_BR=response_attention,
        mask_BR=torch.tensor([_padded([float(m) for m in r.response_mask], width) for r in rows]),
        old_logps_BR=torch.tensor([_padded(r.response_logprobs, width) for r in rows]),
        advantages_B=torch.tensor([float(r.advantage or 0.0) for r in rows]),
        trajectory_ids=[r.trajectory_id for r in rows],
    )


def response_logits(model: PreTrainedModel, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """Logits ``[B, R, V]`` that predict each response token, divided by the sampling temperature."""
    prompt_len_G = batch.prompt_attention_GP.sum(-1)
    prompt_out = model(
        input_ids=batch.prompt_ids_GP, attention_mask=batch.prompt_attention_GP, use_cache=True
    )
    cache = getattr(prompt_out, CACHE_KWARG)
    num_prompts = batch.prompt_ids_GP.shape[0]
    last_GV = prompt_out.logits[torch.arange(num_prompts), prompt_len_G - 1]
    index_B = batch.prompt_index_B
    cache.reorder_cache(index_B)  # one cache row per response, sharing the prompt's graph
    width = batch.response_ids_BR.shape[1]
    attention_BL = torch.cat([batch.prompt_attention_GP[index_B], batch.response_attention_BR], dim=1)
    positions_BR = prompt_len_G[index_B].unsqueeze(-1) + torch.arange(width).unsqueeze(0)
    out = model(
        input_ids=batch.response_ids_BR,
        attention_mask=attention_BL,
        position_ids=positions_BR,
        use_cache=True,
        **{CACHE_KWARG: cache},
    )
    logits_BRV = torch.cat([last_GV[index_B].unsqueeze(1), out.logits[:, :-1]], dim=1)
    return logits_BRV.float() / temperature


def _right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(list(s), dtype=torch.long)
        attention[i, : len(s)] = 1
    return ids, attention


def _padded(values: Sequence[float], width: int) -> list[float]:
    return [float(v) for v in values] + [0.0] * (width - len(values))


#: Most logits elements (rows x response positions x vocabulary) one forward may hold (2 GiB in
#: float32); a larger batch is split into micro-batches whose gradients add up to the same step.
LOGITS_BUDGET = 2**29


def micro_batches(records: Sequence[TrajectoryRecord], pad_id: int, vocab_size: int) -> list[TrainBatch]:
    """The trainable records as batches of at most LOGITS_BUDGET logits each (in order, groups together)."""
    budget = LOGITS_BUDGET
    chunks: list[list[TrajectoryRecord]] = []
    width = 0
    for r in (r for r in records if is_trainable(r)):
        grown = max(width, len(r.response_ids))
        if chunks and (len(chunks[-1]) + 1) * grown * vocab_size <= budget:
            chunks[-1].append(r)
            width = grown
        else:
            chunks.append([r])
            width = len(r.response_ids)
    return [build_batch(chunk, pad_id) for chunk in chunks]
