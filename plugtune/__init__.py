"""plugtune: RL fine-tuning of language models whose rollouts and graders are your own plugins."""

from plugtune.sdk import (
    Context,
    Discard,
    GraderResult,
    Policy,
    Retry,
    RolloutResult,
    Runtime,
    Sample,
    Sampling,
    Status,
    Trajectory,
    grader,
    group_grader,
    rollout,
)

__version__ = "0.1.0"

__all__ = [
    "Context",
    "Discard",
    "GraderResult",
    "Policy",
    "Retry",
    "RolloutResult",
    "Runtime",
    "Sample",
    "Sampling",
    "Status",
    "Trajectory",
    "__version__",
    "grader",
    "group_grader",
    "rollout",
]
