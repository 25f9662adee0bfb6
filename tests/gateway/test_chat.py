from __future__ import annotations

import copy
from typing import Any

from plugtune.gateway.chat import ChatRenderer

ASK = [{"role": "user", "content": "What is 3+4?"}]


def test_renders_and_encodings_are_reused_and_equal_fresh_ones(tokenizer: Any) -> None:
    renderer = ChatRenderer(copy.deepcopy(tokenizer))
    first = renderer.render(ASK, None, add_generation_prompt=True)
    assert renderer.render(ASK, None, add_generation_prompt=True) == first
    assert renderer.render(ASK, None, add_generation_prompt=False) != first
    other = [{"role": "user", "content": "What is 3+5?"}]
    assert renderer.render(other, None, add_generation_prompt=True) == first.replace("3+4", "3+5")
    ids = renderer.encode(first)
    ids.append(-1)  # a caller changing its list never changes what the next caller gets
    assert renderer.encode(first) == list(tokenizer(first, add_special_tokens=False)["input_ids"])


def test_a_template_that_reads_the_clock_is_rendered_afresh(tokenizer: Any) -> None:
    dated = copy.deepcopy(tokenizer)
    dated.chat_template = (
        "{{ strftime_now('%H:%M:%S.%f') }}{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    renderer = ChatRenderer(dated)
    texts = {renderer.render(ASK, None, add_generation_prompt=True) for _ in range(3)}
    assert len(texts) == 3 and all(t.endswith("What is 3+4?") for t in texts)
