"""Try a job's verl path on one machine, on CPU: verl's own classes, no cluster, no GPU.

    python -m plugtune.integrations.verl_dry_run examples/verl/job.yaml --steps 2 --rows 2 --n 2

verl's real ``AgentLoopWorker`` (its config composed from verl's own ``ppo_trainer`` config, the
plugtune agent loop registered through ``agent_loop_config_path`` as on a cluster) runs the job's
rollout plugin for ``--rows`` dataset rows × ``--n`` trajectories per step; its policy calls are
answered by ``LocalServerManager`` (verl's server interface over plugtune's CPU engine and the
job's model, or ``--model``). Then the reward function verl loads from
``reward.custom_reward_function`` (``compute_score``) scores each decoded reply as verl's reward
loop would. Everything lands in one plugtune job (``plugtune serve`` shows it); it prints a line
per trajectory and the job's id. Nothing trains: verl's trainer and its weight updates need a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import uuid4

import numpy as np

from plugtune.errors import DataError
from plugtune.gateway.engine import GenerationEngine
from plugtune.integrations import verl as plugtune_verl
from plugtune.spec.models import resolve_model
from plugtune.spec.rows import read_dataset
from plugtune.spec.validation import refuse_tasks, validate_job
from plugtune.store import Store
from plugtune.trainer.model import load_model


def verl_config(
    job: Path, model: Path, loops: Path, *, n: int, prompt_length: int, response_length: int
) -> Any:
    """verl's own trainer config (``ppo_trainer``) with plugtune's agent loop and reward function."""
    import verl
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={quoted(str(model))}",
                "actor_rollout_ref.rollout.name=vllm",  # its config only: LocalServerManager answers
                f"actor_rollout_ref.rollout.n={n}",
                f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
                f"actor_rollout_ref.rollout.response_length={response_length}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                f"actor_rollout_ref.rollout.agent.agent_loop_config_path={quoted(str(loops))}",
                "actor_rollout_ref.rollout.agent.default_agent_loop=plugtune",
                "reward.custom_reward_function.path=pkg://plugtune.integrations.verl",
                "reward.custom_reward_function.name=compute_score",
                f"+reward.custom_reward_function.reward_kwargs.job={quoted(str(job))}",
            ],
        )


def quoted(value: str) -> str:
    """``value`` as a quoted Hydra override value: a path with spaces, commas, ``#``, ``=`` or
    brackets was a parse error. Hydra escapes a quote, and backslashes only before a quote or at
    the end; ``${`` would still be interpolated, so :func:`main` refuses such a path."""
    out = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    out = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, out)
    return f"'{out}'"


def batch_of(rows: Sequence[dict[str, Any]], first: int, n: int, step: int) -> Any:
    """A verl batch as its trainer hands it to the agent loop workers: each row ``n`` times with
    its ``uid``, verl's columns (``raw_prompt``, ``extra_info``, ``reward_model``...), the step."""
    from verl.protocol import DataProto

    def column(values: list[Any]) -> np.ndarray:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    repeated = [(first + i, row) for i, row in enumerate(rows) for _ in range(n)]
    extras = [dict(row.get("extra") or {}) for _, row in repeated]
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": column([row["messages"] for _, row in repeated]),
            "index": np.array([i for i, _ in repeated]),
            "uid": column([f"s{step}-row{i}" for i, _ in repeated]),
            "data_source": column([str(e.get("data_source", "plugtune")) for e in extras]),
            "reward_model": column([{"ground_truth": e.get("ground_truth")} for e in extras]),
            "extra_info": column([{**e, "index": i} for (i, _), e in zip(repeated, extras, strict=True)]),
        },
        meta_info={"global_steps": step},
    )


def dry_run(
    job: Path, *, steps: int, rows: int, n: int, model: Path | None, response_length: int, out: Any
) -> int:
    """Run the job's verl path for ``steps`` steps; the plugtune job's id."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.reward import get_custom_reward_fn

    validated = validate_job(job, check_model=False)
    refuse_tasks(validated, "verl")  # before the model loads: verl's agent loop refuses it too
    model_dir = model or resolve_model(validated.spec.model, validated.base_dir)
    dataset = read_dataset(validated.train_path)
    loaded = load_model(model_dir)
    tokenizer = loaded.tokenizer
    engine = GenerationEngine(
        loaded.model,
        eos_token_ids={int(tokenizer.eos_token_id)},
        decode=lambda ids: str(tokenizer.decode(ids)),
        weights_lock=threading.Lock(),
        policy_version=lambda: version["now"],
    )
    version = {"now": 0}
    os.environ.setdefault(plugtune_verl.RUN_ENV, f"dry-run-{uuid4().hex[:12]}")  # one job for both paths
    with tempfile.TemporaryDirectory() as tmp:
        loops = Path(tmp) / "agent_loops.yaml"
        loops.write_text(
            "- name: plugtune\n  _target_: plugtune.integrations.verl.PlugtuneAgentLoop\n"
            f"  job: {json.dumps(str(job))}\n"  # a YAML double-quoted scalar: any path reads back
        )
        config = verl_config(job, model_dir, loops, n=n, prompt_length=512, response_length=response_length)
        engine.start()
        try:
            server: Any = plugtune_verl.LocalServerManager(engine)  # verl's server interface
            worker = AgentLoopWorker(config, llm_client=server)
            score = get_custom_reward_fn(config)
            group_rule = validated.spec.failure_policy.group.model_dump() != {
                "drop": "trajectory",
                "min_scored": 0,
            }

            async def all_steps() -> None:  # on one event loop, as verl's worker runs
                for step in range(1, steps + 1):
                    version["now"] = step - 1  # verl's step N samples with the weights of step N - 1
                    first = ((step - 1) * rows) % len(dataset)
                    chosen = [dataset[(first + i) % len(dataset)] for i in range(rows)]
                    output = await worker.generate_sequences(batch_of(chosen, first, n, step))
                    _report(out, step, output, tokenizer, score if not group_rule else None)

            asyncio.run(all_steps())
        finally:
            engine.stop()
    run = plugtune_verl.run_for(job)
    job_id = run.run.job_id
    plugtune_verl.close_runs()
    return job_id


def _report(out: Any, step: int, output: Any, tokenizer: Any, score: Any) -> None:
    batch, extra = output.batch, output.non_tensor_batch
    length = batch["responses"].shape[-1]
    passed_on = [k for k in ("plugtune_step", "min_global_steps", "max_global_steps") if k in extra]
    for i in range(len(output)):
        mask = batch["response_mask"][i]
        valid = int(batch["attention_mask"][i][-length:].sum())  # what verl's reward loop decodes
        reply = str(tokenizer.decode(batch["responses"][i][:valid], skip_special_tokens=True))
        line = (
            f"step {step} row {int(extra['index'][i])}: {extra['plugtune_status'][i]:<8} "
            f"agent-loop reward {float(batch['rm_scores'][i].sum()):.3g}, {int(mask.sum())} trained tokens"
        )
        if score is not None:
            # verl's agent loop passes its extra fields on to the reward function in extra_info
            info = {**dict(extra["extra_info"][i]), **{k: extra[k][i] for k in passed_on}}
            truth = extra["reward_model"][i].get("ground_truth")
            got = score(
                data_source=extra["data_source"][i], solution_str=reply, ground_truth=truth, extra_info=info
            )
            line += f", reward function {got['score']:.3g}"
        print(f"{line}  {reply[:60]!r}", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m plugtune.integrations.verl_dry_run",
        description="Run a job's verl path (agent loop and reward function) on CPU with verl's own classes.",
    )
    parser.add_argument("job", type=Path, help="the job.yaml verl's agent loop and reward function run")
    parser.add_argument("--steps", type=int, default=1, help="steps (batches) to run (default 1)")
    parser.add_argument("--rows", type=int, default=2, help="dataset rows per step (default 2)")
    parser.add_argument("--n", type=int, default=2, help="trajectories per row, verl's rollout.n (default 2)")
    parser.add_argument("--model", type=Path, help="a local model folder (default: the job's model)")
    parser.add_argument("--response-length", type=int, default=64, help="verl's response_length (default 64)")
    args = parser.parse_args(argv)
    for name in ("steps", "rows", "n", "response_length"):
        if not 1 <= getattr(args, name) <= 10_000:
            parser.error(f"--{name.replace('_', '-')} must be between 1 and 10000, not {getattr(args, name)}")
    job = args.job.expanduser().resolve()
    if not job.is_file():
        parser.error(f"the job file {job} does not exist")
    model = args.model.expanduser().resolve() if args.model is not None else None
    for what, path in (("the job file", job), ("--model", model)):
        if path is not None and "${" in str(path):
            parser.error(f"{what} {path}: verl's config reads ${{...}} in a path as an interpolation")
    if model is not None and not (model / "config.json").is_file():
        parser.error(f"--model {model} is not a Hugging Face model folder (it has no config.json)")
    try:
        job_id = dry_run(
            job,
            steps=args.steps,
            rows=args.rows,
            n=args.n,
            model=model,
            response_length=args.response_length,
            out=sys.stdout,
        )
    except DataError as exc:  # the job.yaml, its data or its model: each problem names file:line [field]
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    store = Store.open()
    found = store.get_job(job_id)
    print(f"plugtune job {job_id}: {found.status if found else 'not found'} (plugtune jobs show {job_id})")
    return 0 if found is not None and found.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
