"""What ``Runtime(network=...)`` costs, against ``network: any`` measured in the same run.

Prints one table: the p50 / p99 latency of a rollout doing one ``await policy.achat(...)`` against
the real policy gateway (the demo model, 2 new tokens), through ``LocalRuntime`` with the host's
network (``any``: the baseline) and through the policy-only forwarder and bridge (``policy-only``);
and the deploy time (zygote start, including the namespace) and instance cold start of each mode,
``none`` too. Rounds interleave the modes, so a busy machine slows both alike.

Run: ``python benchmarks/policy_network.py [--calls N] [--rounds N]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from plugtune.demo import MODEL_DIR
from plugtune.gateway import PolicyGateway
from plugtune.runtime import LocalRuntime
from plugtune.sdk import Context, Sample

ROLLOUT = textwrap.dedent(
    """
    from plugtune import rollout

    @rollout
    async def one_call(ctx, policy, sample):
        await policy.achat(sample.messages, max_tokens=2)
    """
)
MODES = ("any", "policy-only", "none")


async def measure(gateway: PolicyGateway, entry: str, calls: int, rounds: int) -> None:
    latencies: dict[str, list[float]] = {m: [] for m in MODES[:2]}
    deploys: dict[str, list[float]] = {m: [] for m in MODES}
    colds: dict[str, list[float]] = {m: [] for m in MODES}
    sample = Sample(messages=[{"role": "user", "content": "hi"}])
    async with LocalRuntime() as rt:
        for r in range(rounds):
            for mode in MODES:
                started = time.perf_counter()
                fn = await rt.deploy(entry, runtime={"network": mode, "min_instances": 1})
                deploys[mode].append((time.perf_counter() - started) * 1000)
                colds[mode].extend(fn.deployment.cold_starts_ms)
                if mode in latencies:
                    for i in range(calls + 5):
                        tid = f"{mode}-{r}-{i}"
                        policy = gateway.open(tid)
                        t0 = time.perf_counter()
                        await fn.invoke(Context(trajectory_id=tid), policy, sample)
                        if i >= 5:  # the first calls open connections (and the forwarder's port)
                            latencies[mode].append((time.perf_counter() - t0) * 1000)
                        gateway.take(tid)
                await fn.close()
    base = statistics.median(latencies["any"])
    print(f"{'row':34} {'p50 ms':>9} {'p99 ms':>9} {'vs any':>8}")
    for mode, values in latencies.items():
        values.sort()
        p50, p99 = statistics.median(values), values[int(len(values) * 0.99) - 1]
        print(f"{'policy call, network ' + mode:34} {p50:9.2f} {p99:9.2f} {p50 / base:8.3f}")
    base_deploy = statistics.median(deploys["any"])
    for mode in MODES:
        d = statistics.median(deploys[mode])
        print(f"{'deploy (zygote), network ' + mode:34} {d:9.1f} {'':>9} {d / base_deploy:8.3f}")
    base_cold = statistics.median(colds["any"])
    for mode in MODES:
        c = statistics.median(colds[mode])
        print(f"{'instance cold start, network ' + mode:34} {c:9.1f} {'':>9} {c / base_cold:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=200, help="timed policy calls per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR)
    with (
        tempfile.TemporaryDirectory() as folder,
        PolicyGateway(model, AutoTokenizer.from_pretrained(MODEL_DIR)) as gw,
    ):
        path = Path(folder) / "one_call.py"
        path.write_text(ROLLOUT)
        path.parent.chmod(0o755)
        asyncio.run(measure(gw, f"{path}:one_call", args.calls, args.rounds))


if __name__ == "__main__":
    main()
