"""``plugtune.llama_family``'s training forward against the model's own: logits and gradients."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from plugtune.llama_family import LlamaFamily, unsupported
from tests.gateway.test_decoding import CASES, tiny


@pytest.mark.parametrize(("family", "extra"), CASES)
def test_the_fused_forward_gives_the_models_logits_and_gradients(family: str, extra: dict[str, Any]) -> None:
    model = tiny(family, **extra)
    model.train()
    assert unsupported(model) is None
    g = torch.Generator().manual_seed(3)
    ids_GL = torch.randint(1, 97, (2, 11), generator=g)
    positions_GL = torch.tensor([list(range(11)), [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 0]])  # packed, padded
    causal_LL = torch.ones(11, 11, dtype=torch.bool).tril()
    mask_G1LL = causal_LL.expand(2, 1, 11, 11).clone()
    mask_G1LL[1, 0, 6:10, 3:6] = False  # a second response that does not see the first
    mask_G1LL[1, 0, 10, :10] = False  # a padding query sees only itself

    family_forward = LlamaFamily(model)
    normed, _, _ = family_forward.forward(ids_GL, positions_GL, mask_G1LL, family_forward.layers())
    ours = family_forward.head(normed)
    theirs = model(input_ids=ids_GL, attention_mask=mask_G1LL, position_ids=positions_GL).logits
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=2e-5)

    weights = torch.randn(ours.shape, generator=g)
    grads_ours = torch.autograd.grad((ours * weights).sum(), list(model.parameters()), allow_unused=True)
    grads_theirs = torch.autograd.grad((theirs * weights).sum(), list(model.parameters()), allow_unused=True)
    for (name, _), a, b in zip(model.named_parameters(), grads_ours, grads_theirs, strict=True):
        if b is None:
            assert a is None or not a.any(), name
            continue
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
