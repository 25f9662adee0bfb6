"""The Llama-family forward as a short, fixed sequence of torch calls over a model's own weights.

``llama``, ``mistral`` and ``qwen2`` causal LMs share one layer: RMSNorm, rotary positions,
grouped-query attention, a SwiGLU MLP. ``LlamaFamily`` runs it with query/key/value as one matrix
product and gate/up as another (copies rebuilt on every ``layers()`` call on a small model — no
stale copy after an optimizer step — and separate products on a large one), rotary in one
``roll``, and the attention through ``scaled_dot_product_attention`` with a ready-made mask. On a
small model a Hugging Face forward costs several times that in Python and small kernels
(decorators, output objects, mask building, rotary in five calls, RMSNorm in seven), both when
decoding (the gateway) and in training (forward and backward). ``unsupported(model)`` says why a
model is not covered (the callers then use the model's own forward); the logits equal the
Hugging Face forward's to float rounding (tests compare them, and the gradients, per family).

It is shared by the gateway and the trainer and imports nothing of plugtune.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the usual name

FAMILIES = ("llama", "mistral", "qwen2")

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")

#: Largest total size of the fused matrix copies that are rebuilt for every ``layers()`` call.
FUSE_BYTES = 64 * 2**20


def unsupported(model: Any) -> str | None:
    """Why ``LlamaFamily`` cannot run ``model`` exactly (None when it can)."""
    cfg = getattr(model, "config", None)
    family = getattr(cfg, "model_type", None)
    if family not in FAMILIES:
        return f"model type {family!r} is not one of {', '.join(FAMILIES)}"
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
        projections = {
            name: getattr(module, name, None)
            for module, names in ((attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (mlp, PROJECTIONS))
            for name in names
        }
        for name, linear in projections.items():
            # Exactly nn.Linear or a plain LoRA over one: a quantized layer computes more than its .weight.
            if type(linear) is not torch.nn.Linear and (why := lora_unsupported(linear)) is not None:
                return f"{name} is {type(linear).__name__}, not a plain nn.Linear ({why})"
        if any(_linear(mlp, name).bias is not None for name in PROJECTIONS):
            return "the MLP is not a bias-free SwiGLU"
    if getattr(model.lm_head, "bias", None) is not None or getattr(cfg, "final_logit_softcapping", None):
        return "the output head has a bias or soft-capping"
    return None


def lora_unsupported(module: Any) -> str | None:
    """Why ``module`` is not a LoRA (peft ``lora.Linear``) this module can run exactly (None when
    it can: one active, unmerged adapter of plain linear maps over a plain ``nn.Linear``)."""
    base = getattr(module, "base_layer", None)
    if type(base) is not torch.nn.Linear or not hasattr(module, "lora_A"):
        return "an adapter or quantized layer?"
    active = list(getattr(module, "active_adapters", []))
    if len(active) != 1 or getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return f"LoRA with adapters {active} active and merged={getattr(module, 'merged', False)}"
    name = active[0]
    if getattr(module, "use_dora", {}).get(name) or getattr(module, "lora_bias", {}).get(name):
        return "LoRA with DoRA or a LoRA bias"
    if getattr(module, "fan_in_fan_out", False) or name not in module.lora_A:
        return "LoRA in fan-in-fan-out layout"
    a, b = module.lora_A[name], module.lora_B[name]
    if type(a) is not torch.nn.Linear or type(b) is not torch.nn.Linear or a.bias is not None:
        return "LoRA matrices that are not bias-free linear maps"
    return None


@dataclass
class Adapter:
    """A LoRA's low-rank update of one linear map: ``y += scale * B(A(dropout(x)))``."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float
    dropout: float  # the probability, when its dropout module is in training mode (else 0)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dropout > 0:
            x = F.dropout(x, self.dropout, training=True)
        return F.linear(F.linear(x, self.a), self.b) * self.scale

    def delta(self) -> torch.Tensor:
        """The update as a matrix ``[out, in]`` (as peft merges it)."""
        return (self.b @ self.a) * self.scale


def weight_and_adapter(module: Any, merge: bool) -> tuple[torch.Tensor, torch.Tensor | None, Adapter | None]:
    """A linear map's weight and bias, and its LoRA kept apart (``merge`` False) or folded into the
    weight (``merge`` True: a copy, made once per call; decoding uses it for every token)."""
    if type(module) is torch.nn.Linear:
        return module.weight, module.bias, None
    name = module.active_adapters[0]
    dropout = module.lora_dropout[name]
    adapter = Adapter(
        a=module.lora_A[name].weight,
        b=module.lora_B[name].weight,
        scale=float(module.scaling[name]),
        dropout=float(dropout.p) if isinstance(dropout, torch.nn.Dropout) and dropout.training else 0.0,
    )
    base = module.base_layer
    if merge:
        return base.weight + adapter.delta(), base.bias, None
    return base.weight, base.bias, adapter


def _linear(parent: Any, name: str) -> torch.nn.Linear:
    """The plain linear map under ``parent.name`` (the base layer of a LoRA)."""
    module = getattr(parent, name)
    return module if type(module) is torch.nn.Linear else module.base_layer


@dataclass
class Projection:
    """Several linear maps of one input, concatenated: one product when ``weight`` is fused.

    LoRA updates kept apart (training: the base weights get no gradient, and the update's
    gradient costs ``r``-wide products) run as one more small product per map."""

    weight: torch.Tensor | None  # the maps' weights stacked, when fused
    bias: torch.Tensor | None
    parts: list[tuple[torch.Tensor, torch.Tensor | None]]  # each map's weight and bias, when not fused
    adapters: list[Adapter | None]  # each map's LoRA update kept apart (or None)
    sizes: list[int]  # each map's output width

    @staticmethod
    def of(linears: list[Any], fuse: bool, merge: bool = False) -> Projection:
        maps = [weight_and_adapter(m, merge) for m in linears]
        adapters = [a for _, _, a in maps]
        sizes = [int(w.shape[0]) for w, _, _ in maps]
        if not fuse:
            return Projection(None, None, [(w, b) for w, b, _ in maps], adapters, sizes)
        biases = [b for _, b, _ in maps]
        bias = torch.cat([b for b in biases if b is not None]) if None not in biases else None
        return Projection(torch.cat([w for w, _, _ in maps]), bias, [], adapters, sizes)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            y = F.linear(x, self.weight, self.bias)
        else:
            y = torch.cat([F.linear(x, w, b) for w, b in self.parts], -1)
        if not any(self.adapters):
            return y
        deltas = [
            a(x) if a is not None else x.new_zeros(*x.shape[:-1], n)
            for a, n in zip(self.adapters, self.sizes, strict=True)
        ]
        return y + torch.cat(deltas, -1)


@dataclass
class Layer:
    norm1: torch.Tensor
    norm2: torch.Tensor
    eps1: float
    eps2: float
    qkv: Projection  # -> [..., (heads + 2 kv_heads) * head_dim]
    w_o_t: torch.Tensor  # o_proj's weight, transposed (a view) for addmm
    b_o: torch.Tensor | None
    gate_up: Projection  # -> [..., 2 * intermediate]
    w_down_t: torch.Tensor
    o_adapter: Adapter | None = None  # LoRA updates kept apart (training)
    down_adapter: Adapter | None = None


class LlamaFamily:
    """A covered model's dimensions, weights and rotary tables (call ``unsupported`` first)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.inner = model.model
        self.family = str(model.config.model_type)
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
        self.final_eps = eps_of(self.inner.norm)
        layer0 = self.inner.layers[0]
        per_layer = sum(
            w.numel() * w.element_size()
            for w in (
                layer0.self_attn.q_proj.weight,
                layer0.self_attn.k_proj.weight,
                layer0.self_attn.v_proj.weight,
                layer0.mlp.gate_proj.weight,
                layer0.mlp.up_proj.weight,
            )
        )
        self.fuse = per_layer * len(self.inner.layers) <= FUSE_BYTES
        self._cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None

    def layers(self, merge: bool = False) -> list[Layer]:
        """The layers' weights as they are now (under autograd when the caller records a graph);
        LoRA updates folded into copies of the weights with ``merge`` (decoding), else kept apart."""
        out = []
        for layer in self.inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            w_o, b_o, o_adapter = weight_and_adapter(attn.o_proj, merge)
            w_down, _, down_adapter = weight_and_adapter(mlp.down_proj, merge)
            out.append(
                Layer(
                    norm1=layer.input_layernorm.weight,
                    norm2=layer.post_attention_layernorm.weight,
                    eps1=eps_of(layer.input_layernorm),
                    eps2=eps_of(layer.post_attention_layernorm),
                    qkv=Projection.of([attn.q_proj, attn.k_proj, attn.v_proj], self.fuse, merge),
                    w_o_t=w_o.t(),
                    b_o=b_o,
                    gate_up=Projection.of([mlp.gate_proj, mlp.up_proj], self.fuse, merge),
                    w_down_t=w_down.t(),
                    o_adapter=o_adapter,
                    down_adapter=down_adapter,
                )
            )
        return out

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

    def forward(
        self,
        ids_GL: torch.Tensor,
        positions_GL: torch.Tensor,
        mask_G1LL: torch.Tensor,
        layers: list[Layer],
        keep_kv: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
        """Hidden states ``[G, L, hidden]`` after the final norm, and each layer's keys and values
        ``[G, kv_heads, L, head_dim]`` when ``keep_kv``. ``mask_G1LL``: True where a query may
        attend a key (every query row must allow at least one key)."""
        G, L = ids_GL.shape
        H, KV, D = self.heads, self.kv_heads, self.head_dim
        weight = self.inner.embed_tokens.weight
        cos, sin = self.cos_sin(int(positions_GL.max()) + 1, weight.dtype, weight.device)
        cos_G1LD = F.embedding(positions_GL, cos)[:, None]
        sin_G1LD = F.embedding(positions_GL, sin)[:, None]
        h = F.embedding(ids_GL, weight)
        keys, values = [], []
        for layer in layers:
            x = rms(h, layer.norm1, layer.eps1)
            qkv_GnLD = layer.qkv(x).view(G, L, H + 2 * KV, D).transpose(1, 2)
            qk = qkv_GnLD[:, : H + KV]
            qk = qk * cos_G1LD + torch.roll(qk, D // 2, -1) * sin_G1LD
            q, k, v = qk[:, :H], qk[:, H:], qkv_GnLD[:, H + KV :]
            out_GHLD = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask_G1LL, scale=self.scale, enable_gqa=self.gqa
            )
            attended = out_GHLD.transpose(1, 2).reshape(G, L, H * D)
            h = h + F.linear(attended, layer.w_o_t.t(), layer.b_o)
            if layer.o_adapter is not None:
                h = h + layer.o_adapter(attended)
            gate, up = layer.gate_up(rms(h, layer.norm2, layer.eps2)).chunk(2, -1)
            act = F.silu(gate) * up
            h = h + F.linear(act, layer.w_down_t.t())
            if layer.down_adapter is not None:
                h = h + layer.down_adapter(act)
            if keep_kv:
                keys.append(k)
                values.append(v)
        return rms(h, self.inner.norm.weight, self.final_eps), keys, values

    def head(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits of final-normed hidden states."""
        return F.linear(normed, self.model.lm_head.weight)


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the Llama family computes it: normalise in float32, scale in the model's dtype."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


def eps_of(norm: Any) -> float:
    eps = getattr(norm, "variance_epsilon", None)
    if eps is None:
        eps = getattr(norm, "eps", 1e-6)
    return float(eps) if eps is not None and math.isfinite(float(eps)) else 1e-6
