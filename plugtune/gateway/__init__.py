"""The policy gateway: an OpenAI-compatible server for the model being trained.

It batches concurrent requests onto the in-process model and records, per trajectory key, the
exact tokens the policy saw and sampled (``TokenTrace``), so the trainer never re-tokenizes text.

    gw = PolicyGateway(model, tokenizer, sampling=JobSampling(1.0, 1.0, 64))  # the job's settings
    gw.start()                                    # HTTP on a background thread; gw.base_url
    policy = gw.open(trajectory_id)               # sdk Policy with that trajectory's key
    ...                                           # the rollout calls policy.openai() / chat()
    trace = gw.take(trajectory_id)                # TokenTrace; the key stops working
    with gw.weights_lock:                         # no batch decodes while weights change
        optimizer.step()
        gw.set_policy_version(step)
    gw.stop()
"""

from plugtune.gateway.engine import GenerationEngine, SamplingParams
from plugtune.gateway.gateway import PolicyGateway
from plugtune.gateway.sampling import JobSampling
from plugtune.gateway.toolcalls import ParsedReply, ToolCall, parse_reply

__all__ = [
    "GenerationEngine",
    "JobSampling",
    "ParsedReply",
    "PolicyGateway",
    "SamplingParams",
    "ToolCall",
    "parse_reply",
]
