"""Write a randomly initialised Llama chat model of a realistic shape, for benchmarks (nothing downloaded).

Default shape: 12 layers, width 768, 12 heads, MLP 2048, vocabulary 32,000, tied embeddings —
about 110M parameters, the size of a BERT-base or GPT-2 small, where matrix products and not
per-request Python dominate a training step. The tokenizer is character-level (printable ASCII
and newline, ChatML specials) padded with filler tokens to the vocabulary size, so the output
head has its full width; the weights are random (seeded), so replies are noise that rarely ends
early: every reply runs to its token budget, for every trainer alike.

    .venv/bin/python scripts/make_real_shape_model.py [--out build/real-shape-llama]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "build" / "real-shape-llama"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make(
    out: Path = DEFAULT_OUT,
    layers: int = 12,
    width: int = 768,
    heads: int = 12,
    intermediate: int = 2048,
    vocab: int = 32_000,
    seed: int = 0,
) -> Path:
    """Write the model and tokenizer to ``out``; returns ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    tokens = SPECIALS + chars
    if vocab < len(tokens):
        raise SystemExit(f"--vocab must be at least {len(tokens)} (specials and characters)")
    tokens += [f"<|filler{i}|>" for i in range(vocab - len(tokens))]
    backend = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(tokens)}, unk_token=SPECIALS[0]))
    backend.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token=SPECIALS[0], unk_token=SPECIALS[0]
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=width,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=tokens.index("<|im_end|>"),
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--intermediate", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make(args.out, args.layers, args.width, args.heads, args.intermediate, args.vocab, args.seed)
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(str(path)).parameters())
    print(f"wrote {path} ({params / 1e6:.1f}M parameters)")


if __name__ == "__main__":
    main()
