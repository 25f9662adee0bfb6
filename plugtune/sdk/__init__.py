"""The plugin SDK: small, typed, stdlib-only. It never imports the platform."""

from plugtune.sdk.context import Context
from plugtune.sdk.decorators import Kind, PluginSpec, grader, group_grader, rollout, spec_of
from plugtune.sdk.policy import Policy, PolicyError
from plugtune.sdk.records import Sample, Sampling, Trajectory
from plugtune.sdk.results import Discard, GraderResult, Retry, RolloutResult, Status
from plugtune.sdk.runtime_spec import Runtime

__all__ = [
    "Context",
    "Discard",
    "GraderResult",
    "Kind",
    "PluginSpec",
    "Policy",
    "PolicyError",
    "Retry",
    "RolloutResult",
    "Runtime",
    "Sample",
    "Sampling",
    "Status",
    "Trajectory",
    "grader",
    "group_grader",
    "rollout",
    "spec_of",
]
