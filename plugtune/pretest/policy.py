"""Which policy a pre-job test talks to: the job's model behind the embedded gateway, or any
OpenAI-compatible endpoint (``--policy-url``) behind a recording relay."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from plugtune.gateway.sampling import JobSampling
from plugtune.pretest.relay import PolicyRelay, forward_to
from plugtune.trainer.protocols import PolicyServer


@dataclass(frozen=True)
class PolicyChoice:
    """``url`` empty: the job's model (``model_dir``) through the embedded gateway, which samples
    with the job's ``sampling`` settings as the job's gateway does."""

    model_dir: Path
    url: str = ""
    api_key: str = ""
    model: str = ""
    sampling: JobSampling | None = None

    def describe(self) -> str:
        return f"{self.url} (model {self.model or 'as requested'})" if self.url else f"{self.model_dir}"


@contextmanager
def serving(choice: PolicyChoice) -> Iterator[PolicyServer]:
    """A started policy server; stopped on exit."""
    if choice.url:
        answer = forward_to(choice.url, choice.api_key or "none", choice.model)
        with PolicyRelay(answer, choice.model or "policy") as relay:
            yield relay
        return
    from transformers.utils import logging as hf_logging

    from plugtune.gateway import PolicyGateway
    from plugtune.trainer.model import load_model

    hf_logging.disable_progress_bar()  # the report, not a loading bar, is the output

    loaded = load_model(choice.model_dir)
    with PolicyGateway(loaded.model, loaded.tokenizer, sampling=choice.sampling) as gateway:
        yield gateway
