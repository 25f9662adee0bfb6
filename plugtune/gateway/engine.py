"""The generation engine: batches pending requests and decodes them together with a KV cache.

One worker thread takes every pending request (up to ``max_batch_size``; it stops gathering when
the burst pauses, or at once when every open caller has a request in), prefills each distinct
prompt once (the rollouts of a GRPO group share theirs), and decodes the rows step by step from
one KV cache; each row stops on its own at an end-of-sequence token, a stop string or its token
budget (finished rows leave the cache once they are a quarter of it); finished rows are answered
together, after at most ``hold_finished_s`` (checked once per decode step) or when the batch
ends. A batch is gathered and decoded under the weights lock, so it sees one version of the
weights from start to end, and records that version; requests that arrive while the trainer
holds the lock wait for the new weights. The model runs through ``plugtune.gateway.decoding``:
a fused decoder for the Llama family, the model's own forward otherwise
(``engine.decoder.description`` says which, and why).

Sampling is per row: temperature (0 = greedy), top-p, and an optional seed. The log-prob recorded
for each token is its log-probability under the distribution it was actually sampled from (after
temperature and top-p); for greedy rows, under the model's unscaled distribution. A request may
ask for the ``top_logprobs`` most likely tokens of that same distribution at each step.
"""

from __future__ import annotations

import itertools
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from plugtune.gateway.decoding import decoder_for

logger = logging.getLogger(__name__)

#: ``threads=AUTO_THREADS``: one intra-op thread for a model of at most ``SMALL_MODEL_BYTES`` of
#: weights (its decode steps are many small kernels, and a second OpenMP team costs the trainer's
#: backward more than threads gain); for a larger one, prefill on the caller's torch thread count
#: and decode on that count or on one, whichever each batch measures faster (``ThreadChoice``).
AUTO_THREADS = 0
SMALL_MODEL_BYTES = 64 * 2**20
#: Gathering waits for a burst's next request at least this share of the last batch's decode
#: time, and for the whole burst at least ``WINDOW_SHARE`` of it (see ``gather_waits``).
GAP_SHARE, WINDOW_SHARE = 0.01, 0.05


def decoding_threads(model: Any) -> int:
    """The most intra-op threads ``AUTO_THREADS`` gives ``model`` (see there)."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return 1 if size <= SMALL_MODEL_BYTES else torch.get_num_threads()


def gather_waits(gap_s: float, window_s: float, last_batch_s: float) -> tuple[float, float]:
    """How long gathering waits for a burst's next request, and for the whole burst.

    The configured gap and window, or a small share of the last batch's decode time when that is
    longer: a batch of a large model takes seconds, and a request that misses it waits for the whole
    next one, so waiting a few percent longer for the burst's stragglers costs less than a second
    batch (on a loaded machine a step's requests arrive spread out: one 32-row step then ran as two
    batches of 12 s each). ``every open caller has asked`` still ends the wait at once.
    """
    return max(gap_s, GAP_SHARE * last_batch_s), max(window_s, WINDOW_SHARE * last_batch_s)


class ThreadChoice:
    """The intra-op thread count of a batch's decode steps: ``most`` or one, whichever is faster now.

    On an idle machine a large model decodes fastest on every core. On a loaded one a team of
    OpenMP threads waits at each of a decode step's many small parallel regions for a thread the
    scheduler has set aside: one 32-row batch of a ~110M-parameter model took over 60 s on 2
    threads and 12.8 s on one at a load average of 10 on 2 cores. So the first ``2 * probe_steps``
    decode steps of every batch alternate the two counts, and the rest run on the one whose
    quickest step was quicker (the load moves: every batch measures again).
    """

    def __init__(self, most: int, probe_steps: int = 2) -> None:
        self.counts = sorted({1, max(1, most)})
        self.probe_steps = probe_steps
        self.chosen: dict[int, int] = dict.fromkeys(self.counts, 0)  # batches decoded on each count
        self._best: dict[int, float] = {}
        self._choice: int | None = None

    def start_batch(self) -> None:
        self._best, self._choice = {}, None

    def threads(self, decode_step: int) -> int:
        """The count to run decode step ``decode_step`` (0-based within the batch) on."""
        if len(self.counts) == 1:
            return self.counts[0]
        if decode_step < self.probe_steps * len(self.counts):
            return self.counts[decode_step % len(self.counts)]
        if self._choice is None:
            self._choice = min(self.counts, key=lambda n: self._best.get(n, float("inf")))
            self.chosen[self._choice] += 1
        return self._choice

    def record(self, threads: int, seconds: float) -> None:
        self._best[threads] = min(seconds, self._best.get(threads, float("inf")))


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples; ``max_tokens`` is already clipped to the context left."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # alternatives to report per token (0: none)


@dataclass(frozen=True)
class Generation:
    """The tokens sampled for one request (stop and end-of-sequence tokens included)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]  # per token, when asked: (id, log-prob), best first
    finish_reason: str  # stop | length
    ended_with_eos: bool
    stop_text_at: int | None  # where a matched stop string starts in the decoded text
    policy_version: int
    batch_size: int


@dataclass
class _Pending:
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[Generation] = field(default_factory=Future)


@dataclass
class _Row:
    """Decoding state of one request inside a batch."""

    pending: _Pending
    generator: torch.Generator | None  # its own when the request has a seed
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = ""
    ended_with_eos: bool = False
    stop_text_at: int | None = None

    @property
    def is_done(self) -> bool:
        return bool(self.finish_reason)


def sample_batch(
    logits_BV: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    shared: torch.Generator,
) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """One token per row, its log-prob under the distribution it was drawn from, and that
    distribution's ``top_logprobs`` most likely tokens for the rows that ask (tokens top-p ruled
    out are not among them).

    Rows with a seed draw from their own generator (so a seed reproduces a reply whatever else
    is in the batch); the others share one draw from ``shared``.
    """
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    scaled_BV = logits_BV.float()
    if len(set(temps)) == 1:  # the usual case (one job, one temperature): a scalar divide
        scaled_BV = scaled_BV / temps[0] if temps[0] != 1.0 else scaled_BV
    else:
        scaled_BV = scaled_BV / torch.tensor(temps)[:, None]
    logps_BV = torch.log_softmax(scaled_BV, -1)
    tokens_B = logps_BV.argmax(-1)
    for b, p in enumerate(params):
        if p.temperature > 0 and p.top_p < 1.0:
            logps_BV[b] = top_p_logps(logps_BV[b], p.top_p)
    unseeded = [b for b, p in enumerate(params) if p.temperature > 0 and generators[b] is None]
    if len(unseeded) == len(params):  # the usual case: every row draws from the shared generator
        tokens_B = draw(logps_BV.exp(), shared)
    elif unseeded:
        tokens_B[unseeded] = draw(logps_BV[unseeded].exp(), shared)
    for b, p in enumerate(params):
        generator = generators[b]
        if p.temperature > 0 and generator is not None:
            tokens_B[b] = draw(logps_BV[b : b + 1].exp(), generator)[0]
    logps_B = logps_BV.gather(-1, tokens_B[:, None])[:, 0]
    tops: list[list[tuple[int, float]]] = [[] for _ in params]
    for b, p in enumerate(params):
        if p.top_logprobs:
            values_K, ids_K = logps_BV[b].topk(min(p.top_logprobs, logps_BV.shape[-1]))
            pairs = zip(ids_K.tolist(), values_K.tolist(), strict=True)
            tops[b] = [(int(i), float(v)) for i, v in pairs if v != float("-inf")]
    return [int(t) for t in tokens_B.tolist()], [float(x) for x in logps_B.tolist()], tops


def draw(probs_UV: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One index per row, drawn with probability ``probs_UV`` (rows need not sum to exactly 1).

    Inverse-CDF sampling: one uniform per row against the row's running sum. It never returns a
    zero-probability index (the first running sum above the uniform grows at that index), and on a
    small vocabulary it costs a fraction of ``torch.multinomial``'s per-call overhead.
    """
    cdf_UV = probs_UV.cumsum(-1)
    u_U1 = torch.rand(probs_UV.shape[0], 1, generator=generator, dtype=cdf_UV.dtype) * cdf_UV[:, -1:]
    return torch.searchsorted(cdf_UV, u_U1, right=True)[:, 0].clamp_(max=probs_UV.shape[-1] - 1)


def top_p_logps(logps_V: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probs restricted to the smallest set whose mass reaches ``top_p``, renormalised."""
    sorted_V, order_V = torch.sort(logps_V, descending=True)
    mass_before_V = torch.cumsum(sorted_V.exp(), -1) - sorted_V.exp()
    keep_V = mass_before_V < top_p
    keep_V[0] = True
    kept_V = torch.full_like(logps_V, float("-inf"))
    kept_V[order_V[keep_V]] = logps_V[order_V[keep_V]]
    return torch.log_softmax(kept_V, -1)


class GenerationEngine:
    """Decodes requests in batches on ``model`` (the very object the trainer updates)."""

    def __init__(
        self,
        model: Any,
        eos_token_ids: set[int],
        decode: Callable[[list[int]], str],
        weights_lock: threading.Lock,
        policy_version: Callable[[], int],
        pad_token_id: int = 0,
        max_batch_size: int = 64,
        batch_gap_s: float = 0.005,
        batch_window_s: float = 0.05,
        open_callers: Callable[[], int] | None = None,
        threads: int | None = AUTO_THREADS,
        hold_finished_s: float = 0.02,
        mask_4d: bool = True,
        fused: bool = True,
    ) -> None:
        self._eos = set(eos_token_ids)
        self._decode = decode
        self._lock = weights_lock
        self._version = policy_version
        self.max_batch_size = max_batch_size
        self._batch_gap_s = batch_gap_s
        self._batch_window_s = batch_window_s
        self._open_callers = open_callers
        self._threads = decoding_threads(model) if threads == AUTO_THREADS else threads
        # Only a large model's decoding chooses (AUTO_THREADS): a given count is kept as given.
        self.thread_choice = (
            ThreadChoice(self._threads) if threads == AUTO_THREADS and self._threads else ThreadChoice(1)
        )
        self._last_batch_s = 0.0  # decode time of the last batch (sizes the gathering wait)
        self._hold_finished_s = hold_finished_s
        self._outstanding = 0  # submitted requests whose future is not done yet
        self._outstanding_lock = threading.Lock()
        self._shared = torch.Generator().manual_seed(secrets.randbits(63))
        self.decoder = decoder_for(model, pad_token_id, fused=fused, mask_4d=mask_4d)
        self._queue: queue.Queue[_Pending | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.batches_run = 0
        self.requests_served = 0

    def start(self) -> None:
        if self._thread is None:
            logger.info("generation engine: %s", self.decoder.description)
            self._thread = threading.Thread(target=self._work, name="plugtune-generation", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout_s)
            self._thread = None

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> Future[Generation]:
        """Queue one request; the future resolves when its batch has finished it."""
        if self._thread is None:
            raise RuntimeError("the generation engine is not running (call start())")
        pending = _Pending(list(prompt_ids), params)
        with self._outstanding_lock:
            self._outstanding += 1
        pending.future.add_done_callback(self._forget)
        self._queue.put(pending)
        return pending.future

    def _forget(self, _: Future[Generation]) -> None:
        with self._outstanding_lock:
            self._outstanding -= 1

    def _everyone_asked(self) -> bool:
        """Whether every caller that could still ask has a request in: then waiting gains nothing."""
        if self._open_callers is None:
            return False
        return self._outstanding >= self._open_callers() > 0

    def _work(self) -> None:
        if self._threads is not None:
            # torch's intra-op thread count is per calling thread once set: this one is the engine's.
            # One for a small model (AUTO_THREADS) because a second OpenMP team in the process makes
            # libgomp throttle every team's spin-wait (more OpenMP threads than cores), which slows
            # the trainer's backward by half on a small machine, and decoding a few tokens per row
            # gains little from threads; a large model's products do gain from them.
            torch.set_num_threads(self._threads)
        while True:
            first = self._queue.get()
            if first is None:
                return
            with self._lock:
                # The batch is gathered under the weights lock: while the trainer updates the
                # weights (the next step's rollouts are already asking), requests queue up, and
                # they all go into one batch once the new weights are in.
                batch, stopping = self._gather(first)
                if batch:
                    self._run(batch)
            if stopping:
                return

    def _gather(self, first: _Pending) -> tuple[list[_Pending], bool]:
        """``first`` and what follows it in the burst; True when the engine is asked to stop."""
        batch = [first]
        gap_s, window_s = gather_waits(self._batch_gap_s, self._batch_window_s, self._last_batch_s)
        window_ends = time.monotonic() + window_s
        stopping = False
        # Requests of one training step arrive in a burst: gather until the burst pauses, or at
        # once when every open trajectory has asked (the rest of the queue is taken as it is).
        while len(batch) < self.max_batch_size:
            wait_s = min(gap_s, window_ends - time.monotonic())
            if self._everyone_asked():
                wait_s = 0.0
            try:
                item = self._queue.get(timeout=max(0.0, wait_s))
            except queue.Empty:
                break
            if item is None:
                stopping = True
                break
            batch.append(item)
        # A caller that gave up (its HTTP request was cancelled) is skipped, not decoded.
        return [p for p in batch if p.future.set_running_or_notify_cancel()], stopping

    def _run(self, batch: list[_Pending]) -> None:
        """Decode ``batch`` (the caller holds the weights lock) and answer every request."""
        self.batches_run += 1
        version = self._version()
        started = time.monotonic()
        try:
            self._decode_batch(batch, lambda row: self._deliver(row, version, len(batch)))
            self._last_batch_s = time.monotonic() - started
        except Exception as exc:  # every waiting caller must hear about it
            logger.exception("generation failed for a batch of %d", len(batch))
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)

    def _deliver(self, row: _Row, version: int, batch_size: int) -> None:
        self.requests_served += 1
        row.pending.future.set_result(
            Generation(
                token_ids=row.tokens,
                logprobs=row.logprobs,
                top_logprobs=row.top_logprobs,
                finish_reason=row.finish_reason,
                ended_with_eos=row.ended_with_eos,
                stop_text_at=row.stop_text_at,
                policy_version=version,
                batch_size=batch_size,
            )
        )

    def _decode_batch(self, batch: list[_Pending], deliver: Callable[[_Row], None]) -> None:
        """Decode the batch; a finished row is handed to ``deliver`` within ``hold_finished_s``.

        Finished rows wait (at most ``hold_finished_s``, or until the batch ends) and are then
        answered together: answering a row wakes the HTTP server and the caller, whose work competes
        with decoding for the interpreter, and a short batch finishes sooner without them; in a long
        batch an early row still goes on after at most that delay.
        """
        held: list[_Row] = []
        try:
            self._decode_rows(batch, held, deliver)
        finally:
            for row in held:
                deliver(row)

    @torch.inference_mode()
    def _decode_rows(self, batch: list[_Pending], held: list[_Row], deliver: Callable[[_Row], None]) -> None:
        """Decode the batch, appending each row to ``held`` when it finishes; deliver and empty it
        whenever its oldest row has waited ``hold_finished_s``.

        Under ``inference_mode`` rather than ``no_grad``: no tensor made here (caches, fused weight
        copies, logits) ever meets autograd, and skipping view and version tracking makes each of a
        decode step's small torch calls cheaper (~9% of a demo batch's decode time).
        """
        live = [_Row(p, _generator(p.params.seed)) for p in batch]  # in the session's row order
        # The rollouts of a GRPO group send the same prompt: it is prefilled once for all of them.
        distinct: dict[tuple[int, ...], int] = {}
        row_prompt = [distinct.setdefault(tuple(p.prompt_ids), len(distinct)) for p in batch]
        choice, most = self.thread_choice, self._threads
        if most is not None and len(choice.counts) > 1:
            torch.set_num_threads(most)  # prefill: large products, on every thread
        session = self.decoder.start(list(distinct), row_prompt, max(p.params.max_tokens for p in batch))
        choice.start_batch()
        oldest = 0.0
        for decode_step in itertools.count():
            tokens, finished = self._step(live, session.logits)
            if not held:
                oldest = time.monotonic()
            held.extend(finished)
            active = [b for b, row in enumerate(live) if not row.is_done]
            if not active:
                return
            if held and time.monotonic() - oldest >= self._hold_finished_s:
                for row in held:
                    deliver(row)  # its caller goes on while the longer rows decode
                held.clear()
            # Finished rows leave the cache once they are a quarter of it: until then the forward
            # they still cost is less than compacting the cache again.
            if (len(live) - len(active)) * 4 >= len(live):
                session.keep(active)
                live, tokens = [live[b] for b in active], [tokens[b] for b in active]
            threads = choice.threads(decode_step)
            if len(choice.counts) > 1 and threads != torch.get_num_threads():
                torch.set_num_threads(threads)
            began = time.perf_counter()
            session.step(tokens)
            choice.record(threads, time.perf_counter() - began)

    def _step(self, live: list[_Row], logits_BV: torch.Tensor) -> tuple[list[int], list[_Row]]:
        """Sample the next token of every row; returns the tokens to feed and the rows that just
        finished (a row finished earlier that still sits in the cache samples, but keeps nothing)."""
        tokens, logps, tops = sample_batch(
            logits_BV.cpu(),
            [row.pending.params for row in live],
            [row.generator for row in live],
            self._shared,
        )
        finished: list[_Row] = []
        for row, token, logp, top in zip(live, tokens, logps, tops, strict=True):
            if row.is_done:
                continue
            row.tokens.append(token)
            row.logprobs.append(logp)
            if row.pending.params.top_logprobs:
                row.top_logprobs.append(top)
            self._finish_if_done(row, token)
            if row.is_done:
                finished.append(row)
        return tokens, finished

    def _finish_if_done(self, row: _Row, token: int) -> None:
        if token in self._eos:
            row.finish_reason, row.ended_with_eos = "stop", True
            return
        if row.pending.params.stop:
            text = self._decode(row.tokens)
            hits = [text.find(s) for s in row.pending.params.stop if s and s in text]
            if hits:
                row.finish_reason, row.stop_text_at = "stop", min(hits)
                return
        if len(row.tokens) >= row.pending.params.max_tokens:
            row.finish_reason = "length"


def _generator(seed: int | None) -> torch.Generator | None:
    return torch.Generator().manual_seed(seed) if seed is not None else None
