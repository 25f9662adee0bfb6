"""``hyperparameters.device``, ``.dtype`` and ``.gradient_checkpointing`` (issue 29 item 3): the
placement's logic on a CPU machine, bfloat16 really training there, checkpointing really recomputing
(and giving the same gradients), and the memory a step needed in its metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from plugtune.errors import InvalidValueError
from plugtune.trainer import objective
from plugtune.trainer.batch import build_batch
from plugtune.trainer.config import TrainerConfig
from plugtune.trainer.model import load_model, placement
from tests.trainer.test_batch import record

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU: the CPU answers do not apply")
def test_placement_on_a_machine_without_a_gpu() -> None:
    assert placement("auto", "auto") == (torch.device("cpu"), torch.float32)
    assert placement("cpu", "bfloat16") == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(InvalidValueError) as info:
        placement("cuda", "auto", file="job.yaml")
    [problem] = info.value.problems
    assert problem.field == "hyperparameters.device" and "torch sees no GPU" in problem.message
    assert "set it to auto or cpu" in problem.message


def test_the_settings_are_validated_and_documented() -> None:
    config = TrainerConfig(device="cpu", dtype="bfloat16", gradient_checkpointing=True)
    assert (config.device, config.dtype, config.gradient_checkpointing) == ("cpu", "bfloat16", True)
    with pytest.raises(InvalidValueError) as info:
        TrainerConfig(dtype="float16")
    assert info.value.problems[0].field == "hyperparameters.dtype"
    docs = TrainerConfig.docs()
    assert docs["device"].endswith("Default 'auto', one of auto, cpu, cuda.")
    assert docs["dtype"].endswith("Default 'auto', one of auto, float32, bfloat16.")


def _batch() -> object:
    records = [
        record("t0", [5, 6, 7], [10, 11], [1, 1], 0.5),
        record("t1", [5, 6, 7], [12, 13], [1, 1], -0.5),
    ]
    return build_batch(records, pad_id=0)


def _grads(model: torch.nn.Module, checkpointing: bool) -> tuple[dict[str, torch.Tensor], int]:
    calls = [0]
    layer = next(m for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))
    # the layer's MLP: the recompute calls the layer's forward (its own hooks stay outside), which
    # calls the MLP again
    hook = layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    if checkpointing:
        objective.checkpoint_activations(model)  # type: ignore[arg-type]
    model.zero_grad(set_to_none=True)
    objective.backward(model, None, [_batch()], temperature=1.0, clip_ratio=0.2, kl_coef=0.0)  # type: ignore[list-item]
    hook.remove()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, calls[0]


def test_gradient_checkpointing_recomputes_in_backward_with_the_same_gradients(tiny_model_path: Path) -> None:
    plain, plain_calls = _grads(load_model(tiny_model_path).model, checkpointing=False)
    saved, saved_calls = _grads(load_model(tiny_model_path).model, checkpointing=True)
    # plugtune's fused forward calls no transformers layer; with checkpointing the model's own forward
    # runs (one call) and each checkpointed layer runs again in backward (a second)
    assert (plain_calls, saved_calls) == (0, 2)
    assert plain.keys() == saved.keys()
    for name, grad in plain.items():
        torch.testing.assert_close(saved[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_bfloat16_trains_on_the_cpu(tiny_model_path: Path) -> None:
    model = load_model(tiny_model_path, device=torch.device("cpu"), dtype=torch.bfloat16).model
    assert next(model.parameters()).dtype == torch.bfloat16
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    parts = objective.backward(model, None, [_batch()], temperature=1.0, clip_ratio=0.2, kl_coef=0.0)  # type: ignore[list-item]
    assert torch.isfinite(torch.tensor(parts.loss))
    torch.optim.AdamW(model.parameters(), lr=1e-2).step()
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
