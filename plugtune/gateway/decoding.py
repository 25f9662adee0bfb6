"""How the engine runs the model for one batch: prefill the prompts, then one token per row per step.

Two decoders share one interface (``Decoder.start`` gives a ``DecodeSession``):

- ``FusedDecoder``, for the models ``plugtune.llama_family`` covers (``llama``, ``mistral``,
  ``qwen2``): the prompts through that module's forward, then per token a short, fixed sequence
  of torch calls over the model's own weights with the residual adds folded into the output
  products, a key/value cache with room to grow in place (no per-step concatenation, no cache
  objects), and the attention mask as a slice of one preallocated mask. On a small model a
  Hugging Face forward costs several times that in Python (decorators, output objects, mask
  building, cache bookkeeping), and decoding is a loop of small forwards.
- ``HFDecoder``, for every other model: the model's own ``forward`` with its ``DynamicCache``.

``decoder_for(model)`` picks one and says why (``Decoder.description``); the fused decoder's
logits equal the Hugging Face forward's to float rounding (tests compare them on each family).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, Protocol

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from transformers.modeling_outputs import CausalLMOutputWithPast

from plugtune import llama_family
from plugtune.llama_family import Layer, LlamaFamily, rms

# transformers renamed ``past_key_values`` to ``cache`` during v5 (the old name warns).
CACHE_KWARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class DecodeSession(Protocol):
    """One batch being decoded: ``logits`` of the next token per live row."""

    logits: torch.Tensor  # [rows, vocab], for the rows still live

    def step(self, tokens: list[int]) -> None:
        """Feed one sampled token per live row; ``logits`` becomes the next step's."""

    def keep(self, rows: list[int]) -> None:
        """Only these live rows (indices into the current ones, in order) go on."""


class Decoder(Protocol):
    description: str

    def start(self, prompts: Sequence[Sequence[int]], row_prompt: list[int], max_new: int) -> DecodeSession:
        """Prefill each distinct prompt once; row ``b`` starts from ``prompts[row_prompt[b]]``."""


def decoder_for(model: Any, pad_token_id: int, fused: bool = True, mask_4d: bool = True) -> Decoder:
    """The fused decoder where ``plugtune.llama_family`` covers the model, else the model's forward."""
    if fused:
        reason = llama_family.unsupported(model)
        if reason is None:
            return FusedDecoder(model)
    else:
        reason = "the fused decoder is turned off"
    return HFDecoder(model, pad_token_id, reason, mask_4d=mask_4d)


def left_padded(prompts: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a 0/1 mask, each prompt right-aligned to the longest."""
    width = max(len(p) for p in prompts)
    ids_GT = torch.tensor([[pad] * (width - len(p)) + [*p] for p in prompts], dtype=torch.long)
    mask_GT = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
    return ids_GT, mask_GT


# --- the model's own forward ------------------------------------------------------------------


class HFDecoder:
    """Any causal LM through its ``forward`` and ``DynamicCache``."""

    def __init__(self, model: Any, pad_token_id: int, why: str = "", mask_4d: bool = True) -> None:
        self.model = model
        self.pad = pad_token_id
        self.description = "Hugging Face forward" + (f" ({why})" if why else "")
        # Prefill needs the logits of the last prompt position only (most models can skip the rest).
        accepts = inspect.signature(model.forward).parameters
        self.last_logits_only = {"logits_to_keep": 1} if "logits_to_keep" in accepts else {}
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        self.mask_4d = attention if mask_4d and attention in ("sdpa", "eager") else None

    def start(self, prompts: Sequence[Sequence[int]], row_prompt: list[int], max_new: int) -> _HFSession:
        return _HFSession(self, prompts, row_prompt)


class _HFSession:
    def __init__(self, decoder: HFDecoder, prompts: Sequence[Sequence[int]], row_prompt: list[int]) -> None:
        self.d = decoder
        model = decoder.model
        device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        ids_GT, mask_GT = (t.to(device) for t in left_padded(prompts, decoder.pad))
        positions_GT = (mask_GT.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=ids_GT,
            attention_mask=mask_GT,
            position_ids=positions_GT,
            use_cache=True,
            **decoder.last_logits_only,
        )
        self.past = getattr(out, CACHE_KWARG)
        index_B = torch.tensor(row_prompt, device=device)
        if len(prompts) < len(row_prompt):  # the rows of a group share their prompt's prefill
            self.past.batch_select_indices(index_B)
        self.logits = out.logits[:, -1, :][index_B]
        self.mask_BT = mask_GT[index_B]
        self.last_pos_B = positions_GT[index_B, -1]

    def keep(self, rows: list[int]) -> None:
        index_K = torch.tensor(rows, device=self.mask_BT.device)
        self.past.batch_select_indices(index_K)
        self.mask_BT, self.last_pos_B = self.mask_BT[index_K], self.last_pos_B[index_K]

    def step(self, tokens: list[int]) -> None:
        self.mask_BT = torch.cat([self.mask_BT, torch.ones_like(self.mask_BT[:, :1])], dim=1)
        self.last_pos_B = self.last_pos_B + 1
        out = self.d.model(
            input_ids=torch.tensor(tokens, dtype=torch.long, device=self.mask_BT.device)[:, None],
            attention_mask=self._decode_mask(),
            position_ids=self.last_pos_B[:, None],
            use_cache=True,
            **{CACHE_KWARG: self.past},
        )
        self.past = getattr(out, CACHE_KWARG)
        self.logits = out.logits[:, -1, :]

    def _decode_mask(self) -> torch.Tensor:
        """The attention mask of one decode step, ready-made in 4D where the attention takes it.

        One new query per row may see every non-padding key, so the 4D mask is the padding mask
        itself (boolean for ``sdpa``, additive for ``eager``); given it, the model skips building a
        causal mask on every step. Other attentions get the 2D mask.
        """
        if self.d.mask_4d == "sdpa":
            return self.mask_BT.bool()[:, None, None, :]
        if self.d.mask_4d == "eager":
            additive = torch.zeros(self.mask_BT.shape, dtype=self.dtype, device=self.mask_BT.device)
            return additive.masked_fill_(self.mask_BT == 0, torch.finfo(self.dtype).min)[:, None, None, :]
        return self.mask_BT


# --- the Llama family, fused -------------------------------------------------------------------


class FusedDecoder:
    """Decoding on ``plugtune.llama_family``: prefill with its forward, then one short step per token."""

    def __init__(self, model: Any) -> None:
        self.f = LlamaFamily(model)
        self.description = f"fused {self.f.family} decoder (static key/value cache, fused projections)"

    @property
    def fuse(self) -> bool:
        return self.f.fuse

    def start(self, prompts: Sequence[Sequence[int]], row_prompt: list[int], max_new: int) -> _FusedSession:
        with torch.no_grad():  # the weights as they are now (the caller holds the weights lock)
            layers = self.f.layers(merge=True)  # a LoRA folded in: one product per map and token
        return _FusedSession(self.f, layers, prompts, row_prompt, max_new)


class _FusedSession:
    """A batch on the fused decoder: per layer, a key and a value cache ``[rows, kv_heads, T, D]``.

    Prompts are left-padded to one width ``P``; the token fed at step ``s`` writes cache column
    ``P + s`` of every live row, so a step's attention mask is a slice of one preallocated mask.
    The caches start with room for 16 new tokens and double when full.
    """

    def __init__(
        self,
        f: LlamaFamily,
        layers: list[Layer],
        prompts: Sequence[Sequence[int]],
        row_prompt: list[int],
        max_new: int,
    ) -> None:
        self.f, self.layers = f, layers
        emb = f.inner.embed_tokens.weight
        self.device, self.dtype = emb.device, emb.dtype
        ids_GT, mask_GT = left_padded(prompts, 0)
        ids_GT, valid_GT = ids_GT.to(self.device), mask_GT.to(self.device).bool()
        positions_GT = (mask_GT.cumsum(-1) - 1).clamp(min=0).to(self.device)
        width = ids_GT.shape[1]
        self.room = width + min(max(max_new, 1), 16)  # most replies are short: grow when one is not
        self.cos, self.sin = f.cos_sin(int(positions_GT.max()) + max_new + 1, self.dtype, self.device)
        causal_PP = torch.ones((width, width), dtype=torch.bool, device=self.device).tril()
        # A padding query sees itself too: a row with no key at all would give NaN (and NaN keys).
        eye_PP = torch.eye(width, dtype=torch.bool, device=self.device)
        mask_G1PP = ((causal_PP[None] & valid_GT[:, None, :]) | eye_PP[None])[:, None]
        normed, keys, values = f.forward(ids_GT, positions_GT, mask_G1PP, layers, keep_kv=True)

        # Each distinct prompt's cache (with its room) is laid out once, then copied to its rows by
        # one index_select (a fraction of indexing with [index_B], and no strided writes).
        index_B = torch.tensor(row_prompt, device=self.device)
        self.keys = [self._rows(k_GHPD, index_B) for k_GHPD in keys]
        self.values = [self._rows(v_GHPD, index_B) for v_GHPD in values]
        valid_G = torch.ones((len(prompts), self.room), dtype=torch.bool, device=self.device)
        valid_G[:, :width] = valid_GT
        self.valid_BT = valid_G.index_select(0, index_B)
        self.pos_B = positions_GT[:, -1].index_select(0, index_B)
        self.column = width  # where the next fed token's key and value go
        self.logits = f.head(normed[:, -1]).index_select(0, index_B)

    def _rows(self, prompt_GHPD: torch.Tensor, index_B: torch.Tensor) -> torch.Tensor:
        G, heads, width, dim = prompt_GHPD.shape
        cache_G = prompt_GHPD.new_empty((G, heads, self.room, dim))
        cache_G[:, :, :width] = prompt_GHPD
        return cache_G.index_select(0, index_B)

    def step(self, tokens: list[int]) -> None:
        f = self.f
        if self.column == self.room:
            self._grow()
        c = self.column
        H, KV, D = f.heads, f.kv_heads, f.head_dim
        rows = len(tokens)
        self.pos_B = self.pos_B + 1
        cos_B1D = F.embedding(self.pos_B, self.cos)[:, None]
        sin_B1D = F.embedding(self.pos_B, self.sin)[:, None]
        mask_B11T = self.valid_BT[:, None, None, : c + 1]
        ids_B = torch.tensor(tokens, dtype=torch.long, device=self.device)
        h = F.embedding(ids_B, f.inner.embed_tokens.weight)
        for layer, keys, values in zip(self.layers, self.keys, self.values, strict=True):
            x = rms(h, layer.norm1, layer.eps1)
            qkv_BnD = layer.qkv(x).view(rows, H + 2 * KV, D)
            qk = qkv_BnD[:, : H + KV]
            qk = qk * cos_B1D + torch.roll(qk, D // 2, -1) * sin_B1D
            keys[:, :, c] = qk[:, H:]
            values[:, :, c] = qkv_BnD[:, H + KV :]
            out_BH1D = F.scaled_dot_product_attention(
                qk[:, :H, None],
                keys[:, :, : c + 1],
                values[:, :, : c + 1],
                attn_mask=mask_B11T,
                scale=f.scale,
                enable_gqa=f.gqa,
            )
            h = torch.addmm(h, out_BH1D.view(rows, H * D), layer.w_o_t)
            if layer.b_o is not None:
                h = h + layer.b_o
            gate_up = layer.gate_up(rms(h, layer.norm2, layer.eps2))
            h = torch.addmm(
                h, F.silu(gate_up[:, : f.intermediate]) * gate_up[:, f.intermediate :], layer.w_down_t
            )
        self.column = c + 1
        self.logits = f.head(rms(h, f.inner.norm.weight, f.final_eps))

    def keep(self, rows: list[int]) -> None:
        index_K = torch.tensor(rows, device=self.device)
        self.keys = [k.index_select(0, index_K) for k in self.keys]
        self.values = [v.index_select(0, index_K) for v in self.values]
        self.valid_BT = self.valid_BT.index_select(0, index_K)
        self.pos_B = self.pos_B.index_select(0, index_K)

    def _grow(self) -> None:
        """Double the caches' room (a long reply; most batches never get here)."""
        extra = self.room
        self.keys = [F.pad(k, (0, 0, 0, extra)) for k in self.keys]
        self.values = [F.pad(v, (0, 0, 0, extra)) for v in self.values]
        self.valid_BT = F.pad(self.valid_BT, (0, extra), value=True)
        self.room += extra
