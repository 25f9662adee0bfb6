"""plugtune's GRPO trainer against TRL's GRPOTrainer: same model, data, batch, group size and max tokens.

Both run on this machine, one after the other, on the demo model and task (exact-match arithmetic)
with the same hyperparameters: ``batch`` prompts x ``group`` completions per step, up to
``max-tokens`` new tokens, temperature 1, no KL, AdamW at the same learning rate, token-level loss.
plugtune goes a job's path: the demo rollout and grader are deployed to the function runtime
(worker processes under their limits), the rollout asks the policy gateway over HTTP, the gateway
batches the concurrent requests, the grader scores, and the trainer steps. TRL generates with
``model.generate`` on the whole batch and calls the same grading logic as a reward function.

TRL runs in a process of its own (started once), so that plugtune's threads (the gateway, the
generation engine, with ``--overlap`` the training thread and its OpenMP team) never share a
process with it.

Every trainer runs at each torch intra-op thread count of ``--threads`` (default 1 and 2: a model
this small is not always faster on more threads, and a shared machine's load moves the answer),
in interleaved rounds. TRL runs with its defaults (gradient checkpointing on) and with
checkpointing off (``--trl-checkpointing``). plugtune's gateway decodes on one intra-op thread of
its own for the demo model and, for the real-shape one, each batch on the count measured or on
one, whichever its first decode steps find faster (its default, by the model's size); the trainer
on the count measured. The headline divides plugtune's best tokens/s by the fastest TRL
run over both TRL configurations and all thread counts.

Prints seconds per step and sampled tokens per second of each (warm-up steps excluded) and the
ratios: per step as medians (robust to a shared machine's hiccups), and over all timed steps
(total tokens / total time, where a slow step such as a full garbage-collection pass counts). The
plugtune process keeps freed memory and freezes its start-up objects, as a job's attempt does;
TRL's process runs as TRL leaves it.

``--model-shape real`` swaps the demo model (2 MiB, where per-request Python dominates) for a
randomly initialised Llama of a realistic shape (12 layers, width 768, vocabulary 32k, ~110M
parameters; ``scripts/make_real_shape_model.py`` writes it to ``build/real-shape-llama`` on first
use, nothing is downloaded), where the matrix products dominate. Its replies are noise that runs to
``max-tokens`` for every trainer, so each step samples the same number of tokens on both sides;
the rewards are all 0 (the task is the demo's), which costs both trainers the same work. Its
defaults are fewer rounds and steps, on 2 threads (a step takes seconds). ``--profile`` prints
where one plugtune step's time goes (torch's profiler, by operator) instead of comparing.

Needs the ``bench`` extra (trl). Run: ``.venv/bin/python benchmarks/trainer_vs_trl.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from plugtune.demo.plugins import grader as demo_grader  # noqa: E402
from plugtune.demo.plugins import rollout as demo_rollout  # noqa: E402
from plugtune.trainer import memory  # noqa: E402
from plugtune.trainer.config import TrainerConfig  # noqa: E402
from plugtune.trainer.groups import Plugins  # noqa: E402
from plugtune.trainer.grpo import GRPOTrainer  # noqa: E402
from plugtune.trainer.model import load_model  # noqa: E402
from plugtune.trainer.testing import InProcessFunction, InProcessPolicyServer  # noqa: E402


@dataclass
class Run:
    name: str
    step_s: list[float]
    tokens: list[int]
    rewards: list[float]
    cpu_s: list[float] = field(default_factory=list)  # CPU time per step: all threads, plugin processes too
    # (plugtune's: the round's CPU time shared out over its steps by their wall time)
    load: list[float] = field(default_factory=list)  # the 1-minute load average as each round ended

    @property
    def tokens_per_s(self) -> float:
        """Median over steps of sampled tokens / step time (robust to a noisy shared machine)."""
        return statistics.median(n / t for n, t in zip(self.tokens, self.step_s, strict=True))

    @property
    def tokens_per_s_overall(self) -> float:
        """Sampled tokens / time over all timed steps: pauses of any step (a GC pass) count too."""
        return sum(self.tokens) / sum(self.step_s)

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)

    @property
    def tokens_per_cpu_s(self) -> float:
        """Sampled tokens per CPU-second: what a step costs, whatever else runs on the machine."""
        return statistics.median(n / t for n, t in zip(self.tokens, self.cpu_s, strict=True))

    def extend(self, other: Run) -> None:
        self.step_s += other.step_s
        self.tokens += other.tokens
        self.rewards += other.rewards
        self.cpu_s += other.cpu_s
        self.load += other.load


def load_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class PlugtuneBench:
    """One plugtune trainer and policy server, stepped in rounds between the TRL rounds."""

    def __init__(self, args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
        self.args = args
        lm = load_model(args.model)
        config = TrainerConfig(
            steps=1_000_000,
            batch_size=args.batch,
            group_size=args.group,
            max_new_tokens=args.max_tokens,
            learning_rate=args.lr,
            seed=args.seed,
            overlap_rollouts=args.overlap,
        )
        fan_out = args.batch * args.group  # the plugins sized for the job's fan-out, as TRL has no cap
        self.loop = asyncio.new_event_loop()
        self.runtime: Any = None
        if args.plugins == "runtime":
            from plugtune.runtime import LocalRuntime

            self.runtime = LocalRuntime()
            self.loop.run_until_complete(self.runtime.start())
            # A step of the real shape takes seconds, many more on a loaded machine: no rollout
            # may time out waiting for its batch (a timed-out step trains on nothing).
            settings = {"max_concurrency": fan_out, "max_instances": 1, "timeout_s": 3600}
            plugins = Plugins(
                rollout=self.loop.run_until_complete(
                    self.runtime.deploy(f"{demo_rollout.__file__}:answer", runtime=settings)
                ),
                graders=[
                    self.loop.run_until_complete(
                        self.runtime.deploy(f"{demo_grader.__file__}:exact_match", runtime=settings)
                    )
                ],
            )
        else:
            plugins = Plugins(
                rollout=InProcessFunction(demo_rollout.answer, concurrency=fan_out),
                graders=[InProcessFunction(demo_grader.exact_match, concurrency=fan_out)],
            )
        self.server, self.stop = make_policy_server(args.policy, lm)
        self.batches = self.steps = 0
        self.trainer = GRPOTrainer(lm.model, lm.tokenizer, self.server, plugins, rows, config)
        memory.settle_for_training()  # as a job's attempt process does once its trainer is built
        self.round(warmup_only=True)

    def round(self, warmup_only: bool = False) -> Run:
        """``warmup`` untimed steps (as each TRL run has), then ``steps`` timed ones, in one go.

        A step's time is the trainer's ``time/step_s`` (with ``--overlap``, the wall time since the
        step before it returned). The round ends with no rollouts left running, so nothing of
        plugtune's runs beside the TRL rounds.
        """
        overlap = ", overlap_rollouts" if self.args.overlap else ""
        run = Run(f"plugtune ({self.args.policy} policy, {self.args.plugins} plugins{overlap})", [], [], [])
        timed = 0 if warmup_only else self.args.steps

        async def steps() -> float:
            for _ in range(self.args.warmup):
                await self.trainer.step()
            cpu = cpu_seconds()
            for _ in range(timed):
                m = (await self.trainer.step()).metrics
                run.step_s.append(m["time/step_s"])
                run.tokens.append(int(m["tokens/policy"]))
                run.rewards.append(m["reward/mean"])
            used = cpu_seconds() - cpu
            await self.trainer.cancel_pending()
            return used

        batches = self.engine_batches()
        cpu_s = self.loop.run_until_complete(steps())
        run.cpu_s = [cpu_s * step_s / sum(run.step_s) for step_s in run.step_s] if timed else []
        run.load = [os.getloadavg()[0]]
        self.batches += self.engine_batches() - batches
        self.steps += self.args.warmup + timed
        return run

    def engine_batches(self) -> int:
        """Decode batches the gateway's engine ran so far (one a step when a step's requests meet)."""
        engine = getattr(self.server, "engine", None)
        return engine.batches_run if engine is not None else 0

    def engine_note(self) -> str:
        engine = getattr(self.server, "engine", None)
        if engine is None:
            return ""
        chosen = engine.thread_choice.chosen
        threads = ", ".join(f"{n} thread(s) {k}x" for n, k in chosen.items()) if len(chosen) > 1 else ""
        return f"plugtune's engine: {self.batches} decode batches in {self.steps} steps" + (
            f"; decode threads chosen per batch: {threads}" if threads else ""
        )

    def close(self) -> None:
        self.stop()
        if self.runtime is not None:
            self.loop.run_until_complete(self.runtime.close())
        self.loop.close()


def cpu_seconds() -> float:
    """CPU time of this process and of its children (the plugins' worker processes) so far."""
    me = psutil.Process()
    total = time.process_time()
    for child in me.children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:  # it exited meanwhile
            continue
        total += times.user + times.system
    return total


def make_policy_server(kind: str, lm: Any) -> tuple[Any, Any]:
    if kind == "inprocess":
        return InProcessPolicyServer(lm.model, lm.tokenizer), lambda: None
    from plugtune.gateway.gateway import PolicyGateway

    gateway = PolicyGateway(lm.model, lm.tokenizer)
    gateway.start()
    return gateway, gateway.stop


class TRLProcess:
    """TRL runs in a process of its own, started once and asked for one run at a time.

    plugtune's process has threads of its own (the gateway, the generation engine, with
    ``--overlap`` a training thread with its own OpenMP team); they slowed TRL's 2-thread step by
    ~15% when it ran beside them, and a second OpenMP team makes libgomp throttle every team's
    spin-wait on a small machine.
    """

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, *argv, "--serve-trl"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, threads: int, checkpointing: bool) -> Run:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"threads": threads, "checkpointing": checkpointing}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the TRL process ended (exit code {self.proc.wait()}); its errors are above")
        return Run(**json.loads(line))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(30)


def serve_trl(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """The TRL process: one JSON request per line on stdin, one Run per line back."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # TRL's own prints go to stderr, not into the replies
    for line in sys.stdin:
        request = json.loads(line)
        torch.set_num_threads(request["threads"])
        run = run_trl(args, rows, checkpointing=request["checkpointing"])
        replies.write(json.dumps(asdict(run)) + "\n")
        replies.flush()


def run_trl(args: argparse.Namespace, rows: list[dict[str, Any]], checkpointing: bool) -> Run:
    """A fresh TRL trainer on a fresh copy of the model: ``warmup`` untimed steps, then ``steps``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig
    from trl import GRPOTrainer as TRLGRPOTrainer

    lm = load_model(args.model)
    dataset = Dataset.from_list([{"prompt": r["messages"], "answer": r["extra"]["answer"]} for r in rows])
    name = (
        "TRL GRPOTrainer (default: gradient checkpointing)"
        if checkpointing
        else "TRL GRPOTrainer, no checkpointing"
    )
    run = Run(name, [], [], [])
    step_tokens: list[int] = []
    step_rewards: list[float] = []

    def exact_match(
        completions: list[Any], completion_ids: list[list[int]], answer: list[str], **_: Any
    ) -> list[float]:
        step_tokens.append(sum(len(ids) for ids in completion_ids))
        rewards = [
            1.0 if c[0]["content"].strip() == a else 0.0 for c, a in zip(completions, answer, strict=True)
        ]
        step_rewards.append(statistics.mean(rewards))
        return rewards

    class Timer(TrainerCallback):  # type: ignore[misc]
        started = 0.0
        cpu = 0.0

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.started = time.perf_counter()
            self.cpu = time.process_time()

        def on_step_end(self, state_args: Any, state: Any, *a: Any, **k: Any) -> None:
            if state.global_step > args.warmup:
                run.step_s.append(time.perf_counter() - self.started)
                run.cpu_s.append(time.process_time() - self.cpu)
                run.tokens.append(step_tokens[-1])
                run.rewards.append(step_rewards[-1])

    with tempfile.TemporaryDirectory() as out:
        run.load = [os.getloadavg()[0]]  # as the run started (it ends after the trainer below)
        config = GRPOConfig(
            output_dir=out,
            per_device_train_batch_size=args.batch * args.group,
            num_generations=args.group,
            gradient_accumulation_steps=1,
            max_completion_length=args.max_tokens,
            learning_rate=args.lr,
            max_steps=args.warmup + args.steps,
            beta=0.0,
            temperature=1.0,
            top_p=1.0,
            loss_type="dapo",
            max_grad_norm=1.0,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            use_cpu=True,
            bf16=False,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            seed=args.seed,
            gradient_checkpointing=checkpointing,
        )
        trainer = TRLGRPOTrainer(
            model=lm.model,
            reward_funcs=[exact_match],
            args=config,
            train_dataset=dataset,
            processing_class=lm.tokenizer,
            callbacks=[Timer()],
        )
        trainer.train()
    run.load.append(os.getloadavg()[0])
    return run


def table(runs: dict[int, list[Run]], args: argparse.Namespace) -> str:
    """One block of rows per torch thread count; plugtune (first row of a block) against each run."""
    lines = [
        f"model {args.model.name}, batch {args.batch} prompts x group {args.group}, "
        f"max {args.max_tokens} new tokens; {args.rounds} interleaved rounds of {args.steps} timed steps "
        f"(after {args.warmup} warm-up) per trainer and thread count; medians",
        "",
        "| trainer | torch threads | s/step | CPU s/step | tokens/step | tokens/s | tokens/CPU-s "
        "| tokens/s, all steps | reward | load average | plugtune is |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for threads, block in runs.items():
        ours = block[0]
        for run in block:
            lines.append(
                f"| {run.name} | {threads} | {run.median_step_s:.3f} | {statistics.median(run.cpu_s):.3f} | "
                f"{statistics.mean(run.tokens):.0f} | {run.tokens_per_s:.0f} | {run.tokens_per_cpu_s:.0f} | "
                f"{run.tokens_per_s_overall:.0f} | "
                f"{statistics.mean(run.rewards):.3f} | {min(run.load):.1f}–{max(run.load):.1f} | "
                f"{ours.tokens_per_s / run.tokens_per_s:.2f}x |"
            )
    lines.append("")
    for threads, block in runs.items():
        best = max(block[1:], key=lambda r: r.tokens_per_s)
        lines.append(
            f"{threads} thread(s): plugtune / faster TRL ({best.name}): "
            f"{block[0].tokens_per_s / best.tokens_per_s:.2f}x tokens/s"
        )
    ours_best = max((b[0] for b in runs.values()), key=lambda r: r.tokens_per_s)
    trl = [(t, r) for t, b in runs.items() for r in b[1:]]
    best_t, best = max(trl, key=lambda tr: tr[1].tokens_per_s)
    cheapest = max((r for _, r in trl), key=lambda r: r.tokens_per_cpu_s)
    ours_cheapest = max((b[0] for b in runs.values()), key=lambda r: r.tokens_per_cpu_s)
    overall = max((b[0] for b in runs.values()), key=lambda r: r.tokens_per_s_overall)
    overall_trl = max((r for _, r in trl), key=lambda r: r.tokens_per_s_overall)
    lines.append(
        f"headline: plugtune at its best / the fastest TRL ({best.name}, {best_t} thread(s)): "
        f"{ours_best.tokens_per_s / best.tokens_per_s:.2f}x tokens/s (wall clock), "
        f"{ours_cheapest.tokens_per_cpu_s / cheapest.tokens_per_cpu_s:.2f}x tokens per CPU-second; "
        f"over all steps {overall.tokens_per_s_overall / overall_trl.tokens_per_s_overall:.2f}x"
    )
    return "\n".join(lines)


def progress(run: Run, threads: int) -> None:
    """One line per round on stderr as it ends (a run stopped early still says what it measured)."""
    steps = ", ".join(f"{t:.2f}" for t in run.step_s)
    line = f"round: {run.name}, {threads} thread(s): s/step {steps}; load {run.load}"
    print(line, file=sys.stderr, flush=True)


def apply_model_shape(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``--model-shape real``: the real-shape model (written if missing) and its smaller defaults,
    where the command line did not set them (the TRL process gets the same argv, so the same)."""
    if args.model_shape != "real":
        return
    given = {a.split("=")[0] for a in sys.argv[1:] if a.startswith("--")}
    if "--model" not in given:
        sys.path.insert(0, str(ROOT / "scripts"))
        from make_real_shape_model import DEFAULT_OUT, make

        if not (DEFAULT_OUT / "config.json").is_file() and not args.serve_trl:
            print(f"writing the real-shape model to {DEFAULT_OUT}", file=sys.stderr)
            make(DEFAULT_OUT)
        args.model = DEFAULT_OUT
    for option, value in (("--rounds", 2), ("--steps", 2), ("--threads", "2")):
        if option not in given:
            setattr(args, option[2:], value)


def profile_step(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    """Where one plugtune step's time goes: torch operators by self CPU time, and the step's phases."""
    from torch.profiler import ProfilerActivity, profile

    torch.set_num_threads(int(str(args.threads).split(",")[0]))
    ours = PlugtuneBench(args, rows)  # its warm-up step ran
    try:

        async def one() -> dict[str, float]:
            return (await ours.trainer.step()).metrics

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            metrics = ours.loop.run_until_complete(one())
    finally:
        ours.close()
    phases = ("time/step_s", "time/plugins_s", "time/train_s", "tokens/policy")
    print({k: round(metrics[k], 3) for k in phases})
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "plugtune/demo/model")
    parser.add_argument("--data", type=Path, default=ROOT / "plugtune/demo/data/train.jsonl")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", choices=["gateway", "inprocess"], default="gateway")
    parser.add_argument(
        "--plugins",
        choices=["runtime", "inprocess"],
        default="runtime",
        help="runtime: the demo plugins deployed to the function runtime, as a job runs them (default); "
        "inprocess: called in this process's threads",
    )
    parser.add_argument(
        "--threads",
        default=",".join(str(n) for n in range(1, min(2, os.cpu_count() or 1) + 1)),
        help="torch intra-op thread counts to measure every trainer at (comma-separated); a tiny model "
        "can run faster on fewer threads, so each trainer is shown at each",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="plugtune with overlap_rollouts (the next step's rollouts start while this one trains)",
    )
    parser.add_argument(
        "--model-shape",
        choices=["demo", "real"],
        default="demo",
        help="demo: the 2 MiB demo model (or --model); real: a random ~110M-parameter Llama "
        "(12 x 768, vocab 32k), built by scripts/make_real_shape_model.py on first use; its defaults "
        "are --rounds 2 --steps 2 --threads 2",
    )
    parser.add_argument(
        "--trl-checkpointing",
        choices=["both", "on", "off"],
        default="both",
        help="TRL runs with gradient checkpointing on (its default), off, or both (default); one halves "
        "the TRL time of a run (a step of the real shape takes minutes on a loaded machine)",
    )
    parser.add_argument("--profile", action="store_true", help="profile one plugtune step; no TRL")
    parser.add_argument("--serve-trl", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    apply_model_shape(args, parser)
    thread_counts = [int(n) for n in str(args.threads).split(",")]
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rows = load_rows(args.data)
    if args.serve_trl:
        serve_trl(args, rows)
        return
    if args.profile:
        profile_step(args, rows)
        return
    trl = TRLProcess(sys.argv[1:])
    torch.set_num_threads(thread_counts[0])
    ours = PlugtuneBench(args, rows)
    checkpointing = {"both": [True, False], "on": [True], "off": [False]}[args.trl_checkpointing]
    runs = {t: [Run("", [], [], []) for _ in range(1 + len(checkpointing))] for t in thread_counts}
    started_load = os.getloadavg()
    try:
        for _ in range(args.rounds):
            for threads in thread_counts:
                torch.set_num_threads(threads)
                results = [ours.round()]
                progress(results[-1], threads)
                for on in checkpointing:
                    results.append(trl.run(threads, checkpointing=on))
                    progress(results[-1], threads)
                for total, result in zip(runs[threads], results, strict=True):
                    total.name = result.name
                    total.extend(result)
    finally:
        ours.close()
        trl.close()
    print(table(runs, args))
    print(
        f"load average (1, 5, 15 min) at the start: {', '.join(f'{x:.1f}' for x in started_load)}; "
        f"at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    print(ours.engine_note())


if __name__ == "__main__":
    main()
