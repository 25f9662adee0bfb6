"""The policy gateway: an OpenAI-compatible server for the model being trained.

It batches concurrent requests onto the in-process model and records, per trajectory key, the
exact tokens the policy saw and sampled (``TokenTrace``), so the trainer never re-tokenizes text.
"""

from plugtune.gateway.engine import GenerationEngine, SamplingParams
from plugtune.gateway.gateway import PolicyGateway
from plugtune.gateway.toolcalls import ParsedReply, ToolCall, parse_reply

__all__ = ["GenerationEngine", "ParsedReply", "PolicyGateway", "SamplingParams", "ToolCall", "parse_reply"]
