"""The embedded trainer on a GPU against TRL's GRPOTrainer on the same GPU: one command, a few minutes.

A randomly initialised Llama of a ~0.5B shape (24 layers, width 896, MLP 4864, 14 heads,
vocabulary 32,000: ~0.42B parameters; ``scripts/make_real_shape_model.py`` writes it, nothing is
downloaded) trains a few GRPO steps on the demo task with each trainer: plugtune's (the
``hyperparameters.device``/``dtype`` path: the model loaded by ``placement``, the policy gateway's
engine decoding on the same GPU, the demo rollout and grader in-process) and TRL's (``bf16`` when
the dtype is bfloat16, its default generation). Printed: seconds per step, sampled tokens per
second (median over timed steps) and the peak GPU memory of each, and plugtune ÷ TRL.

Random weights answer noise that runs to ``--max-tokens`` for both, so each step samples the same
number of tokens on both sides. Each trainer runs in a process of its own (the peak memory is its
own). ``--device cpu --shape small`` runs the same path on a machine without a GPU (a smoke check:
the CPU figures say nothing about a GPU).

Run: ``python benchmarks/gpu_check.py [--device cuda] [--dtype bfloat16] [--steps 4]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHAPES = {  # layers, width, heads, intermediate, vocabulary
    "0.5b": (24, 896, 14, 4864, 32_000),
    "small": (2, 128, 4, 256, 512),
}


def rows() -> list[dict[str, Any]]:
    path = ROOT / "plugtune/demo/data/train.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peak_mib(device: Any) -> float:
    import resource

    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_plugtune(args: argparse.Namespace) -> dict[str, Any]:
    from plugtune.demo.plugins import grader as demo_grader
    from plugtune.demo.plugins import rollout as demo_rollout
    from plugtune.trainer.config import TrainerConfig
    from plugtune.trainer.groups import Plugins
    from plugtune.trainer.grpo import GRPOTrainer
    from plugtune.trainer.model import load_model, placement
    from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer

    device, dtype = placement(args.device, args.dtype, file="gpu_check")
    lm = load_model(args.model, device=device, dtype=dtype)
    fan_out = args.batch * args.group
    config = TrainerConfig(
        steps=1_000_000,
        batch_size=args.batch,
        group_size=args.group,
        max_new_tokens=args.max_tokens,
        learning_rate=1e-5,
        device=args.device,
        dtype=args.dtype,
    )
    plugins = Plugins(
        rollout=InProcessFunction(demo_rollout.answer, concurrency=fan_out),
        graders=[InProcessFunction(demo_grader.exact_match, concurrency=fan_out)],
    )
    server = InProcessPolicyServer(lm.model, lm.tokenizer)
    trainer = GRPOTrainer(lm.model, lm.tokenizer, server, plugins, rows(), config)

    async def steps() -> list[tuple[float, int]]:
        out = []
        for i in range(args.warmup + args.steps):
            m = (await trainer.step()).metrics
            if i >= args.warmup:
                out.append((m["time/step_s"], int(m["tokens/policy"])))
        await trainer.cancel_pending()
        return out

    timed = asyncio.run(steps())
    return _result(f"plugtune ({device}, {str(dtype).removeprefix('torch.')})", timed, peak_mib(device))


def run_trl(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from plugtune.trainer.model import load_model, placement

    device, dtype = placement(args.device, args.dtype, file="gpu_check")
    lm = load_model(args.model, device=device, dtype=dtype)
    data = Dataset.from_list([{"prompt": r["messages"], "answer": r["extra"]["answer"]} for r in rows()])
    tokens: list[int] = []
    timed: list[tuple[float, int]] = []

    def exact_match(
        completions: list[Any], completion_ids: list[list[int]], answer: list[str], **_: Any
    ) -> list[float]:
        tokens.append(sum(len(ids) for ids in completion_ids))
        return [float(c[0]["content"].strip() == a) for c, a in zip(completions, answer, strict=True)]

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            self.started = time.perf_counter()

        def on_step_end(self, state_args: Any, state: Any, *a: Any, **k: Any) -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if state.global_step > args.warmup:
                timed.append((time.perf_counter() - self.started, tokens[-1]))

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch * args.group,
            num_generations=args.group,
            max_completion_length=args.max_tokens,
            learning_rate=1e-5,
            max_steps=args.warmup + args.steps,
            beta=0.0,
            temperature=1.0,
            loss_type="dapo",
            use_cpu=device.type == "cpu",
            bf16=dtype == torch.bfloat16,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_steps=1,
        )
        trainer = GRPOTrainer(
            model=lm.model,
            reward_funcs=[exact_match],
            args=config,
            train_dataset=data,
            processing_class=lm.tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    return _result(
        f"TRL GRPOTrainer ({device}, {str(dtype).removeprefix('torch.')})", timed, peak_mib(device)
    )


def _result(name: str, timed: list[tuple[float, int]], peak: float) -> dict[str, Any]:
    return {
        "name": name,
        "step_s": statistics.median(t for t, _ in timed),
        "tokens_per_s": statistics.median(n / t for t, n in timed),
        "peak_mib": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--dtype", default="bfloat16", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=4, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--side", choices=("plugtune", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # one trainer, in this process: print its result as JSON
        result = run_plugtune(args) if args.side == "plugtune" else run_trl(args)
        print(json.dumps(result))
        return

    from plugtune.errors import InvalidValueError
    from plugtune.trainer.model import placement

    sys.path.insert(0, str(ROOT / "scripts"))
    from make_real_shape_model import make

    try:
        placement(args.device, args.dtype, file="gpu_check")
    except InvalidValueError as exc:
        raise SystemExit(f"gpu_check: {exc.problems[0].message}") from None
    layers, width, heads, intermediate, vocab = SHAPES[args.shape]
    with tempfile.TemporaryDirectory() as tmp:
        model = make(Path(tmp) / "model", layers, width, heads, intermediate, vocab)
        results = []
        for side in ("plugtune", "trl"):
            argv = [sys.executable, __file__, *sys.argv[1:], "--side", side, "--model", str(model)]
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"gpu_check: the {side} run failed:\n{done.stderr[-4000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"\n{args.shape} shape, batch {args.batch} x group {args.group}, {args.max_tokens} new tokens\n")
    print("| trainer | s/step | tokens/s | peak memory MiB |")
    print("|---|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['step_s']:.2f} | {r['tokens_per_s']:.0f} | {r['peak_mib']:.0f} |")
    ours, theirs = results
    print(
        f"\nplugtune ÷ TRL: {ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x tokens/s, "
        f"{ours['peak_mib'] / theirs['peak_mib']:.2f}x peak memory"
    )


if __name__ == "__main__":
    main()
