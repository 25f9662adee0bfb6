"""Trajectory records to training tensors, and the policy's logits on their responses.

The rollouts of a GRPO group start from the same prompt, so each distinct prompt is run through
the model once: the forward packs the prompt and all its responses into one row, with an
attention mask that keeps the responses apart (see ``policy_logits``). Responses are
right-padded in the ``*_BR`` tensors; position ``t`` is response token ``t``.
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from plugtune import llama_family
from plugtune.types import TrajectoryRecord


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

    def to(self, device: torch.device) -> TrainBatch:
        """This batch with its tensors on ``device`` (itself when they are there already)."""
        if self.mask_BR.device == device:
            return self
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return dataclasses.replace(self, **moved)

    @functools.cached_property
    def policy_positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Row and response position of each token the policy sampled (``mask_BR`` 1), row-major
        (found once per batch: the loss, its forward and the reference's forward all use them)."""
        b_N, t_N = torch.nonzero(self.mask_BR > 0, as_tuple=True)
        return b_N, t_N


def is_trainable(record: TrajectoryRecord) -> bool:
    """A record contributes to the loss when it has an advantage, a prompt and policy tokens."""
    return record.advantage is not None and any(record.response_mask) and len(record.prompt_ids) > 0


def untrained_reason(record: TrajectoryRecord) -> str:
    """Why ``record`` gives the policy no policy-gradient signal ('' when it does); a reason it
    already carries (a plugin discarded it) stands."""
    if record.discard_reason:
        return record.discard_reason
    if record.status == "failed":
        error = record.errors[-1] if record.errors else None  # the last try's
        what = f": {error.plugin} {error.cause} (try {error.attempt})" if error else ""
        return f"failed{what}; left out of training"
    if record.reward is None:
        return "unscorable: no grader gave it a reward (each returned None); left out of training"
    if not any(record.response_mask) or not record.prompt_ids:
        return "no policy tokens to train on (the rollout did not call the policy)"
    if record.advantage == 0.0:
        return (
            f"advantage 0: every scored trajectory of group {record.group_id} has reward "
            f"{record.reward:.4g}, so there is nothing to prefer"
        )
    return ""


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


def policy_logits(model: PreTrainedModel, batch: TrainBatch, temperature: float) -> torch.Tensor:
    """Logits ``[N, V]`` that predict the policy's own tokens (``batch.policy_positions``, in
    row-major order), divided by the sampling temperature.

    One forward over one packed row per distinct prompt: the prompt, then each of its responses
    back to back. A 4D attention mask lets every response token see the prompt and its own earlier
    tokens only, and its positions continue the prompt's, so each response is computed exactly as if
    it followed the prompt alone; the prompt is computed once and no compute goes to padding between
    responses (gradients from all responses meet in the shared prompt positions). The output head
    runs only where the loss looks (not on padding, nor on tool or environment tokens).

    The forward is ``plugtune.llama_family``'s where it covers the model, else the model's own:
    custom 4D masks are taken by the ``sdpa`` and ``eager`` attentions; with any other (flash
    attention, say) each response gets a row of its own after a copy of its prompt. A
    sliding-window layer sees the whole packed row, which differs only past the window.
    """
    device = next(model.parameters()).device
    batch = batch.to(device)
    b_N, t_N = batch.policy_positions
    kind = mask_kind(model)
    packed = _pack(batch, shared=kind != "rows")
    if packed.ids_GL.device != device:  # built from lists on the CPU
        packed = _Packed(*(getattr(packed, f.name).to(device) for f in dataclasses.fields(packed)))
    row_N, source_N = packed.row_B[b_N], packed.source_BR[b_N, t_N]
    if kind == "fused":
        family = _family(model)
        normed_GLH, _, _ = family.forward(
            packed.ids_GL, packed.positions_GL, packed.attention_G1LL, family.layers()
        )
        return family.head(normed_GLH[row_N, source_N]).float() / temperature
    mask = packed.attention_G1LL
    if kind == "eager":  # an additive mask
        dtype = next(model.parameters()).dtype
        mask = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, torch.finfo(dtype).min)
    elif kind == "rows":
        mask = packed.attention_G1LL[:, 0].any(1).long()  # one row per response: a padding mask
    out = model(
        input_ids=packed.ids_GL,
        attention_mask=mask,
        position_ids=packed.positions_GL,
        use_cache=False,
    )
    return out.logits[row_N, source_N].float() / temperature


def mask_kind(model: PreTrainedModel) -> str:
    """How ``policy_logits`` runs the model: ``fused`` (``plugtune.llama_family``, a boolean 4D
    mask), or its own forward with a boolean (``sdpa``) or additive (``eager``) 4D mask, or ``rows``.

    The fused forward is skipped where it would differ from the model's own in training:
    gradient checkpointing (memory) and attention dropout.
    """
    dropout = float(getattr(model.config, "attention_dropout", 0.0) or 0.0)
    if (
        llama_family.unsupported(model) is None
        and not _checkpointing(model)
        and not (model.training and dropout > 0)
    ):
        return "fused"
    attention = getattr(model.config, "_attn_implementation", None)
    return attention if attention in ("sdpa", "eager") else "rows"


def _checkpointing(model: PreTrainedModel) -> bool:
    """Whether activation (gradient) checkpointing is on (transformers v5 renamed the property)."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))


_FAMILIES: weakref.WeakKeyDictionary[Any, llama_family.LlamaFamily] = weakref.WeakKeyDictionary()


def _family(model: PreTrainedModel) -> llama_family.LlamaFamily:
    """The model's ``LlamaFamily`` (kept with the model: it holds the rotary tables)."""
    family = _FAMILIES.get(model)
    if family is None:
        family = _FAMILIES[model] = llama_family.LlamaFamily(model)
    return family


@dataclass(frozen=True)
class _Packed:
    ids_GL: torch.Tensor
    positions_GL: torch.Tensor
    attention_G1LL: torch.Tensor  # True where a query position may attend a key position
    row_B: torch.Tensor  # the packed row of each response
    source_BR: torch.Tensor  # the packed position whose logits predict response token t


def _pack(batch: TrainBatch, shared: bool) -> _Packed:
    """Rows of prompt then responses (all of a prompt's responses if ``shared``, else one each)."""
    prompt_lens = batch.prompt_attention_GP.sum(-1).tolist()
    response_lens = batch.response_attention_BR.sum(-1).tolist()
    prompts = batch.prompt_ids_GP.tolist()
    responses = batch.response_ids_BR.tolist()
    width = batch.response_ids_BR.shape[1]
    row = batch.prompt_index_B.tolist()
    if not shared:
        prompts, prompt_lens = [prompts[g] for g in row], [prompt_lens[g] for g in row]
        row = list(range(len(row)))
    ids: list[list[int]] = [p[:n] for p, n in zip(prompts, prompt_lens, strict=True)]
    positions: list[list[int]] = [list(range(n)) for n in prompt_lens]
    segments: list[list[int]] = [[0] * n for n in prompt_lens]  # 0: the prompt, b + 1: response b
    source: list[list[int]] = []
    for b, (g, n) in enumerate(zip(row, response_lens, strict=True)):
        start = len(ids[g])
        source.append([prompt_lens[g] - 1] + [start + t for t in range(n - 1)] + [0] * (width - n))
        ids[g] += responses[b][:n]
        positions[g] += range(prompt_lens[g], prompt_lens[g] + n)
        segments[g] += [b + 1] * n
    length = max(len(x) for x in ids)
    ids_GL = torch.tensor([x + [0] * (length - len(x)) for x in ids], dtype=torch.long)
    positions_GL = torch.tensor([x + [0] * (length - len(x)) for x in positions], dtype=torch.long)
    seg_GL = torch.tensor([x + [-1] * (length - len(x)) for x in segments], dtype=torch.long)
    causal_LL = torch.ones(length, length, dtype=torch.bool).tril()
    same_GLL = (seg_GL[:, :, None] == seg_GL[:, None, :]) | (seg_GL[:, None, :] == 0)
    return _Packed(
        ids_GL=ids_GL,
        positions_GL=positions_GL,
        attention_G1LL=(same_GLL & causal_LL)[:, None],
        row_B=torch.tensor(row, dtype=torch.long),
        source_BR=torch.tensor(source, dtype=torch.long),
    )


def _right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids and a 0/1 mask, right-padded (each built by one ``torch.tensor`` call on padded lists)."""
    width = max(len(s) for s in seqs)
    ids = torch.tensor([[*s, *[pad_id] * (width - len(s))] for s in seqs], dtype=torch.long)
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.long)
    return ids, attention


def _padded(values: Sequence[float], width: int) -> list[float]:
    return [float(v) for v in values] + [0.0] * (width - len(values))


#: Most rows x response positions x vocabulary of one forward (2 GiB of float32 logits, were every
#: position scored; only the policy's tokens are, so the logits held are at most this, and the
#: bound also caps the packed sequence length); a larger batch is split into micro-batches whose
#: gradients add up to the same step.
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
