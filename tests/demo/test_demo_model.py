from __future__ import annotations

import json
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune import Context, Sample, Trajectory
from plugtune.demo import DATA_DIR, MODEL_DIR
from plugtune.demo.plugins.grader import exact_match
from plugtune.demo.plugins.rollout import answer
from plugtune.sdk import Kind, spec_of


def test_the_shipped_model_loads_like_any_model_and_is_small() -> None:
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    assert model.config.model_type == "llama"
    assert tokenizer.eos_token == "<|im_end|>"
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) < 8 * 1024 * 1024


def test_the_chat_template_renders_tools_in_the_hermes_form() -> None:
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}],
        },
        {"role": "tool", "content": "5"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert "<tools>\n" + json.dumps(tools[0]) in text
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
    assert "<|im_start|>assistant\n" + call + "<|im_end|>" in text
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids


def test_the_model_knows_sums_but_words_its_answers_freely() -> None:
    """What GRPO has to fix in the demo: sampled answers are often right but not bare numbers."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    rows = [json.loads(line) for line in (DATA_DIR / "val.jsonl").read_text().splitlines()[:60]]
    exact = right_sum = worded = 0
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=False)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        out = model.generate(ids, max_new_tokens=12, do_sample=True, temperature=1.0, top_k=0)
        text = tokenizer.decode(out[0, ids.shape[1] :].tolist(), skip_special_tokens=True).strip()
        exact += text == row["extra"]["answer"]
        right_sum += re.findall(r"\d+", text) == [row["extra"]["answer"]]
        worded += not text.isdigit()
    assert 0.05 * len(rows) <= exact <= 0.6 * len(rows)
    assert right_sum >= exact + 0.15 * len(rows), (exact, right_sum)
    assert worded >= 0.2 * len(rows)


def test_the_demo_data_rows_are_chats_with_answers() -> None:
    for name in ("train.jsonl", "val.jsonl"):
        rows = [json.loads(line) for line in (DATA_DIR / name).read_text().splitlines()]
        assert len(rows) >= 200
        for row in rows:
            assert row["messages"][-1]["role"] == "user"
            assert row["extra"]["answer"].isdigit()


def test_the_demo_grader_is_exact_match() -> None:
    sample = Sample(messages=[{"role": "user", "content": "What is 2+3?"}], extra={"answer": "5"})

    def graded(text: str) -> float | None:
        trajectory = Trajectory("t", [*sample.messages, {"role": "assistant", "content": text}])
        return exact_match(Context(), sample, trajectory)

    assert graded("5") == 1.0
    assert graded(" 5\n") == 1.0
    assert graded("6") == 0.0
    assert graded("55") == 0.0
    assert exact_match(Context(), Sample(messages=sample.messages), Trajectory("t", [])) is None
    assert spec_of(exact_match).kind is Kind.GRADER  # type: ignore[union-attr]
    assert spec_of(answer).kind is Kind.ROLLOUT  # type: ignore[union-attr]
