"""``SpinQuieter``: the trainer's idle OpenMP threads sleep after a step instead of spin-waiting.

libgomp (the OpenMP of torch's CPU wheels) has every idle thread of a team spin for a while
(``GOMP_SPINCOUNT``, some milliseconds) after each parallel region before it sleeps, so that
back-to-back regions, as in a backward pass, start without a wake-up. After the last region of a
training step that spinning thread holds a core while the next step's rollouts need every core
(the gateway, the generation engine and the plugins take turns on them): on a 2-core machine the
rollout phase at 2 training threads was ~4 ms longer than at 1.

libgomp spins only briefly (a throttled count, chosen when a thread starts to wait) while it
manages more threads than the CPUs it may use. ``quiet()`` makes that so for the step's last
region: a helper thread forms a 2-thread team of its own, one more tiny region on the trainer's
team then ends in the short spin (its idle threads go to sleep at once), and the helper lets its
team go a few milliseconds later, by itself, so other code in the process (and the next backward)
finds libgomp as before. ``release()`` (before the next training phase) makes sure it has.
Nothing changes numerically; with fewer training threads than CPUs, or without OpenMP, both calls
do nothing.
"""

from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger(__name__)

#: Elements of a tensor op that torch splits over its threads (above its grain size of 32768).
_PARALLEL_NUMEL = 1 << 17
#: How long the helper keeps its team: the trainer's idle threads start their (short) wait within
#: microseconds of the last region, and sleep once it is over whatever happens later.
_HOLD_S = 0.005


def _parallel_region() -> None:
    torch.ones(_PARALLEL_NUMEL).mul_(2.0)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class SpinQuieter:
    """Call ``quiet()`` after a training phase and ``release()`` before the next one."""

    def __init__(self) -> None:
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @staticmethod
    def applies() -> bool:
        """Whether the calling thread's team fills the CPUs (then its idle threads would spin)."""
        threads = torch.get_num_threads()
        return torch.backends.openmp.is_available() and 2 <= threads and threads >= _usable_cpus()

    @property
    def started(self) -> bool:
        """Whether ``quiet()`` ran since the last ``release()``."""
        return self._thread is not None

    def quiet(self) -> None:
        """Let the calling thread's idle OpenMP threads sleep right after its next (tiny) region."""
        if self._stop is not None or not self.applies():
            return
        ready, stop = threading.Event(), threading.Event()

        def hold() -> None:
            torch.set_num_threads(2)
            _parallel_region()  # forms this thread's own team
            ready.set()
            stop.wait(_HOLD_S)

        thread = threading.Thread(target=hold, name="plugtune-spin-quieter", daemon=True)
        thread.start()
        if not ready.wait(1.0):
            log.debug("the spin quieter's helper did not start in time")
        self._stop, self._thread = stop, thread
        _parallel_region()  # the trainer's team ends on the short (throttled) spin

    def release(self) -> None:
        """Let the helper's team go (the next regions spin as usual); no-op when not started."""
        if self._stop is None or self._thread is None:
            return
        self._stop.set()
        self._thread.join(1.0)
        self._stop, self._thread = None, None
