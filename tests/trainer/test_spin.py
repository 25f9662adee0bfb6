"""SpinQuieter: a short-lived helper OpenMP team after quiet(); nothing when it does not apply."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from plugtune.trainer import spin
from plugtune.trainer.spin import SpinQuieter


@pytest.fixture
def threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_quiet_holds_a_helper_team_until_release(threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.backends.openmp.is_available():
        pytest.skip("torch is built without OpenMP")
    monkeypatch.setattr(spin, "_usable_cpus", lambda: 2)
    torch.set_num_threads(2)
    quieter = SpinQuieter()
    assert quieter.applies()
    quieter.quiet()
    assert quieter.started
    helper = quieter._thread
    assert helper is not None
    quieter.quiet()  # already started: the same helper
    assert quieter._thread is helper
    assert torch.get_num_threads() == 2  # the caller's own count is untouched
    helper.join(2.0)  # it lets its team go by itself, soon
    assert not helper.is_alive()
    quieter.release()
    assert not quieter.started
    quieter.release()  # idempotent


@pytest.mark.parametrize("count, cpus", [(1, 1), (1, 2), (2, 4)])
def test_nothing_happens_when_the_team_does_not_fill_the_cpus(
    threads: None, monkeypatch: pytest.MonkeyPatch, count: int, cpus: int
) -> None:
    monkeypatch.setattr(spin, "_usable_cpus", lambda: cpus)
    torch.set_num_threads(count)
    quieter = SpinQuieter()
    assert not quieter.applies()
    quieter.quiet()
    assert not quieter.started
    quieter.release()


def test_results_are_unchanged_by_quieting(threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spin, "_usable_cpus", lambda: 2)
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(300, 200, generator=g), torch.randn(200, 100, generator=g)
    plain = a @ b
    quieter = SpinQuieter()
    quieter.quiet()
    try:
        assert torch.equal(a @ b, plain)
    finally:
        quieter.release()
    assert torch.equal(a @ b, plain)
