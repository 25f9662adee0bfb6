"""How the engine runs the model for one batch: prefill the prompts, then one token per row per step.

Two decoders share one interface (``Decoder.start`` gives a ``DecodeSession``):

- ``FusedDecoder``, for the Llama family (``llama``, ``mistral``, ``qwen2``: RMSNorm, rotary
  positions, grouped-query attention, SwiGLU MLP). It runs the model's own weights through a
  short, fixed sequence of torch calls per layer: query/key/value as one matrix product, gate/up
  as another (copies rebuilt for every batch, on a model small enough for that to cost
  microseconds; on larger ones the products run apart), the residual adds
  folded into the output products, a key/value cache with room to grow in place (no per-step
  concatenation, no cache objects), and the attention mask as a slice of one preallocated mask.
  On a small model a Hugging Face forward costs several times that in Python (decorators, output
  objects, mask building, cache bookkeeping), and decoding is a loop of small forwards.
- ``HFDecoder``, for every other model: the model's own ``forward`` with its ``DynamicCache``.

``decoder_for(model)`` picks one and says why (``Decoder.description``); the fused decoder's
logits equal the Hugging Face forward's to float rounding (tests compare them on each family).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name
from transformers.modeling_outputs import CausalLMOutputWithPast

# transformers renamed ``past_key_values`` to ``cache`` during v5 (the old name warns).
CACHE_KWARG = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"

FUSED_FAMILIES = ("llama", "mistral", "qwen2")

#: Largest total size of the fused matrix copies that are rebuilt for every batch.
FUSE_BYTES = 64 * 2**20


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
    """The fused decoder where the model is one of ``FUSED_FAMILIES`` in a form it covers, else HF's."""
    if fused:
        reason = FusedDecoder.unsupported(model)
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


# --- the Llama family, fused ------------------------------------------------------------------


@dataclass
class _Projection:
    """Several linear maps of one input, concatenated: one product when ``weight`` is fused."""

    weight: torch.Tensor | None  # the maps' weights stacked, when fused
    bias: torch.Tensor | None
    parts: list[Any]  # the nn.Linear modules, when not fused

    @staticmethod
    def of(linears: list[Any], fuse: bool) -> _Projection:
        if not fuse:
            return _Projection(None, None, linears)
        biases = [m.bias for m in linears]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        return _Projection(torch.cat([m.weight for m in linears]), bias, [])

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        return torch.cat([F.linear(x, m.weight, m.bias) for m in self.parts], -1)


@dataclass
class _Layer:
    norm1: torch.Tensor
    norm2: torch.Tensor
    eps1: float
    eps2: float
    qkv: _Projection  # -> [..., (heads + 2 kv_heads) * head_dim]
    w_o_t: torch.Tensor  # o_proj's weight, transposed (a view) for addmm
    b_o: torch.Tensor | None
    gate_up: _Projection  # -> [..., 2 * intermediate]
    w_down_t: torch.Tensor


class FusedDecoder:
    """The Llama-family forward as a fixed sequence of torch calls over the model's own weights."""

    def __init__(self, model: Any) -> None:
        cfg = model.config
        self.model = model
        self.inner = model.model
        attn = self.inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(attn.q_proj.weight.shape[0]) // self.head_dim
        self.kv_heads = int(attn.k_proj.weight.shape[0]) // self.head_dim
        self.scale = float(getattr(attn, "scaling", self.head_dim**-0.5))
        self.gqa = self.heads != self.kv_heads
        self.intermediate = int(self.inner.layers[0].mlp.gate_proj.weight.shape[0])
        rope = self.inner.rotary_emb
        self.inv_freq = rope.inv_freq.detach().float().clone()
        self.rope_scale = float(getattr(rope, "attention_scaling", 1.0))
        self.final_eps = _eps(self.inner.norm)
        self.layers: list[_Layer] = []
        # Fusing copies the query/key/value and gate/up matrices; on a model this small the copies
        # are rebuilt for every batch (microseconds; no stale copy after an optimizer step), on a
        # larger one the products run separately (each already big enough to amortise its call).
        layer0 = self.inner.layers[0]
        per_layer = sum(
            w.numel() * w.element_size()
            for w in (
                *(p.weight for p in (layer0.self_attn.q_proj, layer0.self_attn.k_proj)),
                layer0.self_attn.v_proj.weight,
                layer0.mlp.gate_proj.weight,
                layer0.mlp.up_proj.weight,
            )
        )
        self.fuse = per_layer * len(self.inner.layers) <= FUSE_BYTES
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        self.description = f"fused {cfg.model_type} decoder (static key/value cache, fused projections)"

    @staticmethod
    def unsupported(model: Any) -> str | None:
        """Why the fused decoder cannot run ``model`` exactly (None when it can)."""
        cfg = getattr(model, "config", None)
        family = getattr(cfg, "model_type", None)
        if family not in FUSED_FAMILIES:
            return f"model type {family!r} is not one of {', '.join(FUSED_FAMILIES)}"
        inner = getattr(model, "model", None)
        layers = getattr(inner, "layers", None)
        if inner is None or not layers or getattr(model, "lm_head", None) is None:
            return f"the {type(model).__name__} object is not a plain {family} causal LM"
        act = getattr(cfg, "hidden_act", "silu")
        if act != "silu":
            return f"hidden_act {act!r} (the fused MLP is SwiGLU)"
        rope = getattr(inner, "rotary_emb", None)
        rope_type = getattr(rope, "rope_type", "default")
        if rope is None or not hasattr(rope, "inv_freq") or rope_type in ("dynamic", "longrope"):
            return f"rotary embedding type {rope_type!r} changes with the sequence length"
        window = getattr(cfg, "sliding_window", None)
        layer_types = set(getattr(cfg, "layer_types", None) or [])
        if window is not None and (family == "mistral" or "sliding_attention" in layer_types):
            return f"sliding-window attention ({window} tokens)"
        for layer in layers:
            attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
            if attn is None or mlp is None or hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
                return f"a {type(layer).__name__} layer is not the plain {family} layer"
            if getattr(mlp, "gate_proj", None) is None or mlp.gate_proj.bias is not None:
                return "the MLP is not a bias-free SwiGLU"
        if getattr(model.lm_head, "bias", None) is not None or getattr(cfg, "final_logit_softcapping", None):
            return "the output head has a bias or soft-capping"
        return None

    def start(self, prompts: Sequence[Sequence[int]], row_prompt: list[int], max_new: int) -> _FusedSession:
        with torch.no_grad():  # the weights as they are now (the caller holds the weights lock)
            self.layers = [self._layer(layer) for layer in self.inner.layers]
        return _FusedSession(self, prompts, row_prompt, max_new)

    def cos_sin(
        self, positions: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables for positions ``0 .. positions-1``: cos, and sin with its first half negated.

        ``x * cos + rotate_half(x) * sin`` equals ``x * cos + roll(x, half) * sin_signed``; a roll
        is one call where rotate_half is three.
        """
        have = self._cos_sin
        if have is None or have[0].shape[0] < positions or have[0].dtype != dtype:
            size = max(positions, 2 * (have[0].shape[0] if have is not None else 256))
            freqs = torch.arange(size, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
            half = freqs.shape[-1]
            cos = torch.cat([freqs, freqs], -1).cos() * self.rope_scale
            sin = torch.cat([freqs, freqs], -1).sin() * self.rope_scale
            sin[:, :half] = -sin[:, :half]
            self._cos_sin = have = (cos.to(dtype=dtype, device=device), sin.to(dtype=dtype, device=device))
        return have

    def _layer(self, layer: Any) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
        gate_up = [mlp.gate_proj, mlp.up_proj]
        return _Layer(
            norm1=layer.input_layernorm.weight,
            norm2=layer.post_attention_layernorm.weight,
            eps1=_eps(layer.input_layernorm),
            eps2=_eps(layer.post_attention_layernorm),
            qkv=_Projection.of(qkv, self.fuse),
            w_o_t=attn.o_proj.weight.t(),
            b_o=attn.o_proj.bias,
            gate_up=_Projection.of(gate_up, self.fuse),
            w_down_t=mlp.down_proj.weight.t(),
        )


class _FusedSession:
    """A batch on the fused decoder: per layer, a key and a value cache ``[rows, kv_heads, T, D]``.

    Prompts are left-padded to one width ``P``; the token fed at step ``s`` writes cache column
    ``P + s`` of every live row, so a step's attention mask is a slice of one preallocated mask.
    The caches start with room for 64 new tokens and double when full.
    """

    def __init__(
        self, d: FusedDecoder, prompts: Sequence[Sequence[int]], row_prompt: list[int], max_new: int
    ) -> None:
        self.d = d
        emb = d.inner.embed_tokens.weight
        self.device, self.dtype = emb.device, emb.dtype
        ids_GT, mask_GT = left_padded(prompts, 0)
        ids_GT, valid_GT = ids_GT.to(self.device), mask_GT.to(self.device).bool()
        positions_GT = (mask_GT.cumsum(-1) - 1).clamp(min=0).to(self.device)
        self.width = width = ids_GT.shape[1]
        self.room = width + min(max(max_new, 1), 64)
        self.cos, self.sin = d.cos_sin(int(positions_GT.max()) + max_new + 1, self.dtype, self.device)
        keys, values, logits_GV = self._prefill(ids_GT, valid_GT, positions_GT)

        index_B = torch.tensor(row_prompt, device=self.device)
        rows = len(row_prompt)
        shape = (rows, d.kv_heads, self.room, d.head_dim)
        self.keys, self.values = [], []
        for k_GHPD, v_GHPD in zip(keys, values, strict=True):
            k = torch.empty(shape, dtype=self.dtype, device=self.device)
            v = torch.empty(shape, dtype=self.dtype, device=self.device)
            k[:, :, :width] = k_GHPD.index_select(0, index_B)  # (index_select: a fraction of [index_B])
            v[:, :, :width] = v_GHPD.index_select(0, index_B)
            self.keys.append(k)
            self.values.append(v)
        self.valid_BT = torch.ones((rows, self.room), dtype=torch.bool, device=self.device)
        self.valid_BT[:, :width] = valid_GT.index_select(0, index_B)
        self.pos_B = positions_GT[:, -1].index_select(0, index_B)
        self.column = width  # where the next fed token's key and value go
        self.logits = logits_GV.index_select(0, index_B)

    def _prefill(
        self, ids_GT: torch.Tensor, valid_GT: torch.Tensor, positions_GT: torch.Tensor
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        d = self.d
        G, P = ids_GT.shape
        H, KV, D = d.heads, d.kv_heads, d.head_dim
        causal_PP = torch.ones((P, P), dtype=torch.bool, device=self.device).tril()
        # A padding query sees itself too: a row with no key at all would give NaN (and NaN keys).
        eye_PP = torch.eye(P, dtype=torch.bool, device=self.device)
        mask_G1PP = ((causal_PP[None] & valid_GT[:, None, :]) | eye_PP[None])[:, None]
        cos_G1PD = F.embedding(positions_GT, self.cos)[:, None]
        sin_G1PD = F.embedding(positions_GT, self.sin)[:, None]
        h = F.embedding(ids_GT, d.inner.embed_tokens.weight)
        keys, values = [], []
        for layer in d.layers:
            x = _rms(h, layer.norm1, layer.eps1)
            qkv_GnPD = layer.qkv(x).view(G, P, H + 2 * KV, D).transpose(1, 2)
            qk = qkv_GnPD[:, : H + KV]
            qk = qk * cos_G1PD + torch.roll(qk, D // 2, -1) * sin_G1PD
            q, k, v = qk[:, :H], qk[:, H:], qkv_GnPD[:, H + KV :]
            out_GHPD = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask_G1PP, scale=d.scale, enable_gqa=d.gqa
            )
            h = h + F.linear(out_GHPD.transpose(1, 2).reshape(G, P, H * D), layer.w_o_t.t(), layer.b_o)
            h = h + self._mlp(_rms(h, layer.norm2, layer.eps2), layer)
            keys.append(k)
            values.append(v)
        return keys, values, self._head(h[:, -1])

    def step(self, tokens: list[int]) -> None:
        d = self.d
        if self.column == self.room:
            self._grow()
        c = self.column
        H, KV, D = d.heads, d.kv_heads, d.head_dim
        rows = len(tokens)
        self.pos_B = self.pos_B + 1
        cos_B1D, sin_B1D = (
            F.embedding(self.pos_B, self.cos)[:, None],
            F.embedding(self.pos_B, self.sin)[:, None],
        )
        mask_B11T = self.valid_BT[:, None, None, : c + 1]
        h = F.embedding(
            torch.tensor(tokens, dtype=torch.long, device=self.device), d.inner.embed_tokens.weight
        )
        for layer, keys, values in zip(d.layers, self.keys, self.values, strict=True):
            x = _rms(h, layer.norm1, layer.eps1)
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
                scale=d.scale,
                enable_gqa=d.gqa,
            )
            h = torch.addmm(h, out_BH1D.view(rows, H * D), layer.w_o_t)
            if layer.b_o is not None:
                h = h + layer.b_o
            x = _rms(h, layer.norm2, layer.eps2)
            gate_up = layer.gate_up(x)
            h = torch.addmm(
                h, F.silu(gate_up[:, : d.intermediate]) * gate_up[:, d.intermediate :], layer.w_down_t
            )
        self.column = c + 1
        self.logits = self._head(h)

    def keep(self, rows: list[int]) -> None:
        index_K = torch.tensor(rows, device=self.device)
        self.keys = [k.index_select(0, index_K) for k in self.keys]
        self.values = [v.index_select(0, index_K) for v in self.values]
        self.valid_BT, self.pos_B = (
            self.valid_BT.index_select(0, index_K),
            self.pos_B.index_select(0, index_K),
        )

    def _grow(self) -> None:
        """Double the caches' room (a long reply; most batches never get here)."""
        extra = self.room
        self.keys = [F.pad(k, (0, 0, 0, extra)) for k in self.keys]
        self.values = [F.pad(v, (0, 0, 0, extra)) for v in self.values]
        self.valid_BT = F.pad(self.valid_BT, (0, extra), value=True)
        self.room += extra

    def _mlp(self, x: torch.Tensor, layer: _Layer) -> torch.Tensor:
        gate, up = layer.gate_up(x).chunk(2, -1)
        return F.linear(F.silu(gate) * up, layer.w_down_t.t())

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        d = self.d
        return F.linear(_rms(h, d.inner.norm.weight, d.final_eps), d.model.lm_head.weight)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the Llama family computes it: normalise in float32, scale in the model's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def _eps(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps", 1e-6)
    return float(eps) if eps is not None and math.isfinite(float(eps)) else 1e-6
