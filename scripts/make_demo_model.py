"""Build plugtune's demo model from scratch: a tiny Llama chat model that adds numbers, badly.

It trains a byte-level BPE tokenizer (digits split one per token) with a ChatML chat template that
supports tools in the Hermes/Qwen ``<tool_call>{json}</tool_call>`` form, pre-trains a small
``LlamaConfig`` model on synthetic "What is a+b?" chats, and stops as soon as its greedy accuracy
on the validation prompts reaches ``--target`` — so the shipped model answers in the right format
but only part of the time correctly, and a short GRPO run can visibly raise the reward.

Everything is seeded; the same command on the same machine gives the same model. Writes
``plugtune/demo/model/`` (config, safetensors, tokenizer) and ``plugtune/demo/data/*.jsonl``.

    .venv/bin/python scripts/make_demo_model.py
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "plugtune" / "demo"

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Single tokens (like Qwen's), but not "special": they survive decoding with skip_special_tokens.
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls or [] %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if loop.first and message.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QUESTIONS = ["What is {a}+{b}?", "What is {a} + {b}?", "Compute {a}+{b}.", "{a}+{b}=?"]
# How pre-training answers are worded. The grader wants the bare number, so the shipped model
# knows most sums but words its answer the bare way only some of the time: GRPO's job in the demo
# is to make it answer as asked (fast, visible), on top of getting more sums right (slow).
STYLES = ["{n}", "{n}", "The answer is {n}.", "{n}.", "It is {n}"]


def make_pairs(seed: int, max_operand: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(seed).shuffle(pairs)
    n_val = len(pairs) // 10
    return pairs[n_val:], pairs[:n_val]


def chat_row(a: int, b: int, template: str) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": template.format(a=a, b=b)}],
        "extra": {"answer": str(a + b)},
    }


def corpus_text(pairs: list[tuple[int, int]]) -> list[str]:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    lines = [
        f"system\nuser\n{q.format(a=a, b=b)}\nassistant\n{style.format(n=a + b)}\n"
        for a, b in pairs[:500]
        for q in QUESTIONS
        for style in STYLES[1:]
    ]
    lines.append(json.dumps(tool) + ' <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    lines.append("You may call one or more functions to assist with the user query. system user assistant")
    return lines


def build_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\d"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_tokens(ADDED_TOKENS)
    return tok


def wrap_tokenizer(tok: Tokenizer) -> PreTrainedTokenizerFast:
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def encode_example(
    tokenizer: PreTrainedTokenizerFast, row: dict[str, Any], style: str = "{n}"
) -> tuple[list[int], int]:
    """Ids of prompt + answer + <|im_end|>, and where the answer starts (loss is on the answer)."""
    prompt = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(str(prompt), add_special_tokens=False)["input_ids"]
    answer = style.format(n=row["extra"]["answer"])
    answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return list(prompt_ids) + list(answer_ids), len(prompt_ids)


def make_batch(
    examples: list[tuple[list[int], int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    ids_BT = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(examples), width), dtype=torch.long)
    labels_BT = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, start) in enumerate(examples):
        ids_BT[row, : len(ids)] = torch.tensor(ids)
        mask_BT[row, : len(ids)] = 1
        labels_BT[row, start : len(ids)] = torch.tensor(ids[start:])
    return ids_BT, mask_BT, labels_BT


@torch.no_grad()
def accuracy(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    rows: list[dict[str, Any]],
    temperature: float,
    seed: int,
    max_new_tokens: int = 8,
    exact: bool = True,
) -> float:
    """Share of rows whose decoded reply equals the answer (greedy when temperature is 0).

    With ``exact=False``: share whose reply holds the right sum as its only number, however worded.
    """
    model.eval()
    prompts = [
        str(tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False))
        for r in rows
    ]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    generator = torch.Generator().manual_seed(seed)
    ids_BT, mask_BT = enc["input_ids"], enc["attention_mask"]
    done_B = torch.zeros(len(rows), dtype=torch.bool)
    out: list[list[int]] = [[] for _ in rows]
    for _ in range(max_new_tokens):
        logits_BV = model(input_ids=ids_BT, attention_mask=mask_BT).logits[:, -1, :]
        if temperature == 0:
            next_B = logits_BV.argmax(-1)
        else:
            probs_BV = torch.softmax(logits_BV / temperature, -1)
            next_B = torch.multinomial(probs_BV, 1, generator=generator).squeeze(-1)
        for i, token in enumerate(next_B.tolist()):
            if not done_B[i]:
                out[i].append(token)
        done_B |= next_B == tokenizer.eos_token_id
        ids_BT = torch.cat([ids_BT, next_B[:, None]], dim=1)
        mask_BT = torch.cat([mask_BT, torch.ones_like(next_B)[:, None]], dim=1)
        if bool(done_B.all()):
            break
    model.train()
    correct = 0
    for row, tokens in zip(rows, out, strict=True):
        if tokens and tokens[-1] == tokenizer.eos_token_id:
            text = tokenizer.decode(tokens[:-1])
            if exact:
                correct += int(text == row["extra"]["answer"])
            else:
                correct += int(re.findall(r"\d+", text) == [row["extra"]["answer"]])
    return correct / len(rows)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def check_reload(out_dir: Path, tokenizer: PreTrainedTokenizerFast, probe: list[dict[str, Any]]) -> None:
    """The saved directory loads through the Auto classes and tokenizes exactly as trained."""
    loaded = AutoTokenizer.from_pretrained(out_dir)
    AutoModelForCausalLM.from_pretrained(out_dir)
    text = str(tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False))
    text += '<tool_call>\n{"name": "add", "arguments": {"a": 17, "b": 5}}\n</tool_call><|im_end|>'
    want = tokenizer(text, add_special_tokens=False)["input_ids"]
    got = loaded(text, add_special_tokens=False)["input_ids"]
    if want != got or loaded.decode(got) != text:
        raise SystemExit(f"AutoTokenizer does not reproduce the tokenizer:\n{want}\n{got}")
    if str(loaded.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)) not in text:
        raise SystemExit("AutoTokenizer renders a different chat template")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-operand", type=int, default=49)
    parser.add_argument(
        "--target", type=float, default=0.75, help="stop at this greedy val accuracy of the sum (any wording)"
    )
    parser.add_argument("--max-steps", type=int, default=4000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEMO)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    train_pairs, val_pairs = make_pairs(args.seed, args.max_operand)
    train_rows = [chat_row(a, b, rng.choice(QUESTIONS)) for a, b in train_pairs]
    val_rows = [chat_row(a, b, rng.choice(QUESTIONS)) for a, b in val_pairs]
    # The RL data: the same distribution; the model has seen these pairs but not mastered them.
    rl_rows = [chat_row(a, b, rng.choice(QUESTIONS)) for a, b in rng.sample(train_pairs, 512)]

    tokenizer = wrap_tokenizer(build_tokenizer(corpus_text(train_pairs), vocab_size=384))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    examples = [[encode_example(tokenizer, r, style) for style in STYLES] for r in train_rows]
    eval_rows = val_rows[:200]
    started = time.monotonic()
    acc = 0.0
    step = 0
    for step in range(1, args.max_steps + 1):
        batch = [rng.choice(examples[rng.randrange(len(examples))]) for _ in range(args.batch_size)]
        ids_BT, mask_BT, labels_BT = make_batch(batch, tokenizer.pad_token_id)
        loss = model(input_ids=ids_BT, attention_mask=mask_BT, labels=labels_BT).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0:
            acc = accuracy(model, tokenizer, eval_rows, temperature=0.0, seed=args.seed, exact=False)
            elapsed = time.monotonic() - started
            print(f"step {step:5d}  loss {loss.item():.4f}  greedy val sum acc {acc:.3f}  {elapsed:.0f}s")
            if acc >= args.target:
                break

    model.eval()
    out_model = args.out / "model"
    out_model.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_model, safe_serialization=True)
    tokenizer.save_pretrained(out_model)
    write_jsonl(args.out / "data" / "train.jsonl", rl_rows)
    write_jsonl(args.out / "data" / "val.jsonl", val_rows)
    check_reload(out_model, tokenizer, val_rows[0]["messages"])

    greedy = accuracy(model, tokenizer, val_rows, temperature=0.0, seed=args.seed)
    sampled = accuracy(model, tokenizer, val_rows, temperature=1.0, seed=args.seed)
    rl_sampled = accuracy(model, tokenizer, rl_rows, temperature=1.0, seed=args.seed)
    rl_sums = accuracy(model, tokenizer, rl_rows, temperature=1.0, seed=args.seed, exact=False)
    size_kb = sum(p.stat().st_size for p in out_model.iterdir()) / 1024
    n_params = sum(p.numel() for p in model.parameters())
    print(f"steps {step}, {time.monotonic() - started:.0f}s, {n_params} params")
    print(f"val ({len(val_rows)} rows): greedy accuracy {greedy:.3f}, sampled (T=1) accuracy {sampled:.3f}")
    print(f"train.jsonl ({len(rl_rows)} rows): sampled (T=1) exact-answer accuracy {rl_sampled:.3f}, "
          f"right sum however worded {rl_sums:.3f}")
    print(f"wrote {out_model} ({size_kb:.0f} KiB)")


if __name__ == "__main__":
    main()
