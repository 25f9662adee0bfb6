"""TRL's GRPOTrainer with plugtune's plugins against TRL on its own, in one run (ratios).

1. Rewards: TRL with a plain Python reward function (exact match, in the trainer's process) vs the
   same run with the demo grader called through plugtune's runtime (``reward_funcs``): seconds per
   step, and the overhead per step (target: at most 5%). A demo step is ~60 ms and whole-step
   medians swing by several percent between runs, so the seconds spent inside the reward
   functions are timed too: plugtune's share of the step that the trainer waits for. It misses
   what runs beside the step (a background store write per step once slowed the step's torch
   work by ~7%), which only the whole-step figure shows: read both.
2. Generation: TRL's own generation (``model.generate``) vs ``rollout_func`` (the demo rollout in
   the runtime, its policy calls answered by plugtune's gateway from the trainer's model): sampled
   tokens per second (target: within 10%).

Each configuration runs ``--rounds`` times, interleaved, on the demo model and task, CPU, with the
same batch, group size, max tokens and seed; medians of steps after ``--warmup``. Needs the
``trl`` extra. Run: ``.venv/bin/python benchmarks/trl_plugins.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugtune.integrations import trl as pt  # noqa: E402
from plugtune.spec.rows import read_dataset  # noqa: E402
from plugtune.trainer.model import load_model  # noqa: E402

DEMO = ROOT / "plugtune/demo"


def plain_exact_match(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    return [1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)]


def timed(fn: Any, spent: list[float]) -> Any:
    """``fn`` adding the seconds of each call to ``spent[-1]`` (TRL names the reward by __name__)."""

    def reward(*a: Any, **k: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[-1] += time.perf_counter() - started

    reward.__name__ = fn.__name__
    return reward


def one_run(args: argparse.Namespace, mode: str, store: Any) -> tuple[list[float], list[float], list[float]]:
    """Step seconds, sampled tokens per second and seconds inside the reward functions of the
    timed steps of one TRL run."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    run = pt.open_run(DEMO / "job.yaml", store=store, group_size=args.group) if mode != "plain" else None
    rows = run.rows if run else read_dataset(DEMO / "data/train.jsonl")
    dataset = Dataset.from_list(
        [{"prompt": r["messages"], "answer": r["extra"]["answer"], pt.ROW: i} for i, r in enumerate(rows)]
    )
    steps: list[float] = []
    rates: list[float] = []
    spent: list[float] = [0.0]  # seconds inside the reward functions, per step
    rewards: list[float] = []

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()
            spent.append(0.0)

        def on_log(self, _a: Any, state: Any, _c: Any, logs: dict[str, Any] | None = None, **k: Any) -> None:
            if logs and "completions/mean_length" in logs and state.global_step > args.warmup:
                seconds = time.perf_counter() - self.started
                steps.append(seconds)
                rates.append(logs["completions/mean_length"] * args.batch * args.group / seconds)
                rewards.append(spent[-1])

    lm = load_model(DEMO / "model")
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch * args.group,
            num_generations=args.group,
            max_completion_length=args.max_tokens,
            learning_rate=1e-5,
            max_steps=args.warmup + args.steps,
            beta=0.0,
            loss_type="dapo",
            use_cpu=True,
            bf16=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=0,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=lm.model,
            reward_funcs=[timed(f, spent) for f in (run.reward_funcs() if run else [plain_exact_match])],
            args=config,
            train_dataset=dataset,
            processing_class=lm.tokenizer,
            rollout_func=run.rollout_func() if run is not None and mode == "rollout" else None,
            callbacks=[Timer()] + ([run.callback()] if run is not None else []),
        )
        trainer.train()
    return steps, rates, rewards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16, help="timed steps per run")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=12)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from plugtune.store import Store

    results: dict[str, tuple[list[float], list[float], list[float]]] = {
        m: ([], [], []) for m in ("plain", "reward", "rollout")
    }
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as home:
        store = Store.open(f"sqlite:///{home}/plugtune.db")
        for _ in range(args.rounds):
            for mode, (steps, rates, rewards) in results.items():
                s, r, g = one_run(args, mode, store)
                steps += s
                rates += r
                rewards += g
        store.close()
    load_after = os.getloadavg()
    med = {m: tuple(statistics.median(x) for x in lists) for m, lists in results.items()}
    print(f"demo task, batch {args.batch} x group {args.group}, max {args.max_tokens} tokens, CPU; medians")
    loads = f"{load_before[0]:.1f} before, {load_after[0]:.1f} after"
    print(f"load average (1 min) {loads}, {os.cpu_count()} CPUs")
    print("| TRL run | s/step | sampled tokens/s | s in reward functions per step |\n|---|---|---|---|")
    for mode, label in (
        ("plain", "plain reward function, TRL generates"),
        ("reward", "plugtune reward_funcs, TRL generates"),
        ("rollout", "plugtune reward_funcs + rollout_func"),
    ):
        print(f"| {label} | {med[mode][0]:.3f} | {med[mode][1]:.0f} | {med[mode][2]:.4f} |")
    overhead = med["reward"][0] / med["plain"][0] - 1
    print(f"grader through plugtune's runtime: {overhead:+.1%} per step, whole steps (target <= +5%)")
    inside = (med["reward"][2] - med["plain"][2]) / med["plain"][0]
    print(f"  of which inside the reward functions: {inside:+.2%} of a plain step")
    ratio = med["rollout"][1] / med["reward"][1]
    print(f"rollout_func / TRL's own generation: {ratio:.2f}x tokens/s (target 0.90x or more)")


if __name__ == "__main__":
    main()
