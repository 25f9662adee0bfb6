"""rollout_func with use_vllm=True: TRL's real VLLMClient answers the rollout's policy calls.

No GPU and no vLLM here: TRL's client talks HTTP to ``LocalVLLMServer``, which serves the part of
vLLM's API the client uses with real decoding on plugtune's CPU engine. Only TRL's import guard
(``is_vllm_available``) is told vLLM is there; the client's own code runs unchanged.
"""

from __future__ import annotations

import os
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugtune.integrations import trl as pt
from plugtune.integrations.token_gateway import TokenGateway
from plugtune.integrations.trl_vllm import VLLMEngine, vllm_client_of
from plugtune.integrations.vllm_server import LocalVLLMServer
from plugtune.store import Store
from plugtune.trainer.model import load_model
from tests.integrations.conftest import TASK

pytest.importorskip("trl")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
DEMO_MODEL = Path(pt.__file__).parents[1] / "demo" / "model"


@pytest.fixture()
def vllm_client_class(monkeypatch: pytest.MonkeyPatch) -> Any:
    from trl.generation import vllm_client

    monkeypatch.setattr(vllm_client, "is_vllm_available", lambda *a, **k: True)
    return vllm_client.VLLMClient


@pytest.fixture()
def demo() -> Any:
    return load_model(DEMO_MODEL)


@pytest.fixture()
def server(demo: Any) -> Iterator[LocalVLLMServer]:
    s = LocalVLLMServer(demo.model, demo.tokenizer)
    s.start()
    yield s
    s.stop()


def test_trls_vllm_client_answers_policy_calls_with_the_servers_tokens(
    vllm_client_class: Any, server: LocalVLLMServer, demo: Any
) -> None:
    client = vllm_client_class(base_url=server.base_url)
    direct = client.generate([[1, 2, 3]], n=2, max_tokens=4, logprobs=0)
    assert len(direct["completion_ids"]) == 2 and all(0 < len(c) <= 4 for c in direct["completion_ids"])

    engine = VLLMEngine(client)
    gateway = TokenGateway(demo.tokenizer, engine.generate, engine.loop)
    gateway.start()
    try:
        asked = server.requests
        policy = gateway.open("t-1")
        reply = policy.chat([{"role": "user", "content": "21+38=?"}], max_tokens=6)
        trace = gateway.take("t-1")
    finally:
        gateway.stop()
        engine.close()
    assert server.requests - asked == 1  # one generate call on the server for one policy call
    assert trace.response_ids and len(trace.response_ids) <= 6
    assert policy.content(reply) == demo.tokenizer.decode(trace.response_ids, skip_special_tokens=True)
    assert trace.response_mask == [1] * len(trace.response_ids)
    assert all(lp < 0 for lp in trace.response_logprobs)  # the server's sampling log-probs, not 0.0


def test_weight_sync_needs_a_real_server_and_the_error_says_how_to_start_it(
    vllm_client_class: Any, server: LocalVLLMServer
) -> None:
    client = vllm_client_class(base_url=server.base_url)
    with pytest.raises(RuntimeError, match="weight-transfer-config"):
        client.init_communicator(device="cpu")


def test_colocate_mode_is_refused_with_what_to_do_instead() -> None:
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(vllm_mode="colocate"))
    with pytest.raises(ValueError, match="vllm_mode='server'.*trl vllm-serve"):
        vllm_client_of(trainer)


@pytest.mark.slow
def test_grpo_trainer_in_vllm_server_mode_trains_on_the_rollouts_the_server_sampled(
    vllm_client_class: Any, server: LocalVLLMServer, demo: Any, store: Store, tmp_path: Path
) -> None:
    from trl import GRPOConfig, GRPOTrainer

    run = pt.open_run(TASK / "job.yaml", store=store)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-5,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
        reward_weights=run.reward_weights(),
    )
    trainer = GRPOTrainer(
        model=demo.model,
        reward_funcs=run.reward_funcs(),
        args=config,
        train_dataset=run.dataset(),
        processing_class=demo.tokenizer,
        rollout_func=run.rollout_func(),
        callbacks=[run.callback()],
    )
    # What GRPOConfig(use_vllm=True, vllm_mode="server") sets up, with TRL's real client. Its NCCL
    # weight sync needs CUDA; the local server decodes from this trainer's model object, so the
    # weights it samples with are the trained ones and there is nothing to sync.
    trainer.use_vllm = trainer.args.use_vllm = True
    trainer.vllm_mode = trainer.args.vllm_mode = "server"
    client = vllm_client_class(base_url=server.base_url)
    trainer.vllm_generation = types.SimpleNamespace(vllm_client=client, sync_weights=lambda: None)
    trainer._last_loaded_step = -1
    asked = server.requests
    trainer.train()

    assert server.requests - asked == 2 * 4 * 2  # two policy calls per rollout, 4 rollouts, 2 steps
    job = store.get_job(run.run.job_id)
    assert job is not None and job.status == "succeeded"
    ids = [t.trajectory_id for t in store.trajectories(run.run.job_id, limit=100)]
    records = store.trajectory_records(run.run.job_id, ids)
    assert len(records) == 8
    for r in records:  # the server's tokens and the tool's turn between them, masked out
        assert 0 in r.response_mask and 1 in r.response_mask
        sampled = [lp for lp, m in zip(r.response_logprobs, r.response_mask, strict=True) if m]
        assert sampled and all(lp < 0 for lp in sampled)
    assert {r.step for r in records} == {1, 2}
