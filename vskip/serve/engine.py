"""The server's decode worker: one thread drives the decode loop (:class:`vskip.engine.decode.Loop`).

Requests wait in a bounded queue; between rounds the worker admits them into free slots
(continuous batching), ends the ones their client cancelled or that ran past their deadline, and
after each round hands every request the text its committed tokens add, with the stop strings
applied. The HTTP side (:mod:`vskip.serve.app`) reads a request's events from an asyncio queue the
worker fills through the event loop's thread-safe call.

A failure in one request's own steps (its round's decisions, its text) fails that request alone;
a failure of a forward the batch shares fails the requests in that forward, and the worker goes on
with the others.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..engine.decode import DecodeResult, Job, Loop, Step
from .metrics import Metrics
from .protocol import ApiError


@dataclass
class Request:
    """One request in the server: its job, stop strings and deadline, and what it has produced.
    ``events`` receives ``("text", str)``, then ``("done", dict)`` or ``("error", ApiError)``."""

    id: str
    job: Job
    stops: tuple[str, ...]
    timeout: float | None
    aloop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.monotonic)
    admitted: float | None = None
    first: float | None = None
    #: when tokens were last delivered
    last: float | None = None
    tokens: list[int] = field(default_factory=list)
    sent: int = 0
    cancelled: bool = False
    finished: bool = False

    def emit(self, kind: str, data) -> None:
        try:
            self.aloop.call_soon_threadsafe(self.events.put_nowait, (kind, data))
        except RuntimeError:  # the event loop is closed: nobody reads this request any more
            pass

    @property
    def expired(self) -> bool:
        return self.timeout is not None and time.monotonic() - self.arrived > self.timeout


def vskip_block(res: DecodeResult, policy: str) -> dict:
    """A response's ``vskip`` block: what the method did for this request."""
    judged = [r for r in res.rounds if r.verified and r.gamma > 0]
    unverified = sum(r.K for r in res.rounds if not r.verified)
    n = res.generated_tokens
    return {"policy": policy, "rounds": len(res.rounds), "verifier_calls": res.verifier_calls,
            "draft_blocks": res.draft_blocks, "skipped_rounds": res.skipped_rounds,
            "mean_accepted_length": sum(r.accepted for r in judged) / len(judged) if judged else None,
            "unverified_tokens": unverified, "unverified_share": unverified / n if n else 0.0}


class Engine:
    """The worker thread and its queue. ``max_queue``: requests that may wait for a slot (one more
    is refused at once with 429); ``request_timeout``: seconds from arrival to the last token."""

    def __init__(self, loop: Loop, tokenizer, metrics: Metrics, max_queue: int, request_timeout: float | None):
        self.loop, self.tok, self.metrics = loop, tokenizer, metrics
        self.max_queue, self.request_timeout = max_queue, request_timeout
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}
        self.cv = threading.Condition()
        self.draining = self.stopped = False
        self.thread = threading.Thread(target=self._run, name="vskip-decode", daemon=True)

    # -- the HTTP side ---------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, req: Request) -> None:
        """Queue ``req``, or refuse it at once: 503 while the server drains, 429 when the queue is full
        (the requests the free slots will take at the next round's start do not count as queued)."""
        with self.cv:
            if self.draining or self.stopped:
                self.metrics.of(self.metrics.rejected, reason="draining").inc()
                raise ApiError(503, "the server is shutting down", "service_unavailable_error")
            free = max(0, self.loop.batch_size - len(self.running))
            if len(self.waiting) >= self.max_queue + free:
                self.metrics.of(self.metrics.rejected, reason="queue_full").inc()
                raise ApiError(429, f"the server is at capacity ({len(self.running)} decoding, "
                                    f"{len(self.waiting)} waiting); retry later", "rate_limit_error")
            self.waiting.append(req)
            self._gauges()
            self.cv.notify()

    def cancel(self, req: Request) -> None:
        """The client is gone: end ``req`` between rounds and free its slot."""
        with self.cv:
            req.cancelled = True
            self.cv.notify()

    def drain(self) -> None:
        """Refuse new requests; the admitted ones go on."""
        with self.cv:
            self.draining = True

    def end_now(self) -> None:
        """End the worker after its current round: what is still queued or decoding fails with 503
        (a stream's last event before ``[DONE]``)."""
        with self.cv:
            self.stopped = True
            self.cv.notify()

    def stop(self, timeout: float = 10.0) -> None:
        """End the worker (:meth:`end_now`) and wait for it."""
        self.end_now()
        if self.thread.is_alive():
            self.thread.join(timeout)

    # -- the worker ------------------------------------------------------------------------------
    def _gauges(self) -> None:
        self.metrics.of(self.metrics.running).set(len(self.running))
        self.metrics.of(self.metrics.waiting).set(len(self.waiting))

    def _run(self) -> None:
        while self._turn():
            pass

    def _turn(self) -> bool:
        """One turn of the worker: admit, run a round, deliver; False once stopped. A failure of the
        round (a forward the batch shares) or of the worker's own bookkeeping fails the requests
        decoding then, and the worker goes on."""
        try:
            with self.cv:
                while not self.stopped and not self.waiting and not self.running:
                    self.cv.wait()
                if self.stopped:
                    self._fail_all(ApiError(503, "the server shut down before this request finished",
                                            "service_unavailable_error"), waiting=True)
                    return False
                self._reap()
                self._admit()
                self._gauges()
            if not self.running:
                return True
            steps = self.loop.round()
            self.metrics.round(len(steps), [s.record for s in steps if s.record is not None])
            for step in steps:
                self._deliver(step)
            self._gauges()
        except Exception as e:  # noqa: BLE001 - the requests of this round fail, the server goes on
            self._fail_all(ApiError(500, f"the decode failed: {type(e).__name__}: {e}", "internal_error"))
        return True

    def _fail_all(self, err: ApiError, waiting: bool = False) -> None:
        """Fail every decoding request (and the waiting ones too) with ``err``; free their slots."""
        if waiting:
            for req in self.waiting:
                self._fail(req, err)
            self.waiting.clear()
        for slot in list(self.running):
            self._fail(self.running[slot], err)
            self._end(slot)
        self._gauges()

    def _reap(self) -> None:
        """Drop the cancelled and the expired, waiting or decoding."""
        for req in [r for r in self.waiting if r.cancelled or r.expired]:
            self.waiting.remove(req)
            if not req.cancelled:
                self._fail(req, _timeout(self.request_timeout))
            self._finished(req, "cancelled" if req.cancelled else "timeout")  # counted as a running one is
        for slot, req in list(self.running.items()):
            if req.cancelled or req.expired:
                if not req.cancelled:
                    self._fail(req, _timeout(self.request_timeout))
                self._finished(req, "cancelled" if req.cancelled else "timeout")
                self._end(slot)

    def _admit(self) -> None:
        while self.waiting and self.loop.free:
            req = self.waiting.popleft()
            try:
                slot = self.loop.admit(req.job)
            except Exception as e:  # noqa: BLE001 - this request fails alone
                self._fail(req, ApiError(400, str(e), "invalid_request_error") if isinstance(e, ValueError)
                           else ApiError(500, f"{type(e).__name__}: {e}", "internal_error"))
                continue
            req.admitted = time.monotonic()
            self.metrics.of(self.metrics.queue).observe(req.admitted - req.arrived)
            self.metrics.of(self.metrics.prompt_tokens).inc(len(req.job.prompt))
            self.running[slot] = req

    def _end(self, slot: int) -> DecodeResult | None:
        """Free ``slot`` of the loop (if the loop still holds it) and of the server."""
        self.running.pop(slot, None)
        return self.loop.cancel(slot) if slot in self.loop.active else None

    def _fail(self, req: Request, err: ApiError) -> None:
        req.finished = True
        req.emit("error", err)

    def _finished(self, req: Request, reason: str) -> None:
        self.metrics.of(self.metrics.finished, finished_reason=reason).inc()
        if req.first is not None:
            end = time.monotonic()
            self.metrics.of(self.metrics.e2e).observe(end - req.arrived)
            self.metrics.of(self.metrics.decode).observe(end - req.first)
            if len(req.tokens) > 1:
                self.metrics.of(self.metrics.tpot).observe((end - req.first) / (len(req.tokens) - 1))

    def _timed(self, req: Request) -> None:
        """Observe a delivery's latency: the first token's (from arrival, and from admission), or the gap since the last."""
        t = time.monotonic()
        if req.first is None:
            req.first = t
            self.metrics.of(self.metrics.ttft).observe(t - req.arrived)
            self.metrics.of(self.metrics.prefill).observe(t - req.admitted)
        else:
            self.metrics.of(self.metrics.itl).observe(t - req.last)
        req.last = t

    def _deliver(self, step: Step) -> None:
        """Hand ``step``'s tokens to its request as text; finish it at a stop string, EOS or its budget."""
        req = self.running.get(step.slot)
        if req is None:
            return
        try:
            if step.error is not None:
                raise step.error
            req.tokens += step.committed
            if step.committed:
                self._timed(req)
            text = self.tok.decode(req.tokens, skip_special_tokens=True)
            cut = min((i for i in (text.find(s) for s in req.stops) if i >= 0), default=None)
            result, reason = step.result, None
            if cut is not None:
                text, reason = text[:cut], "stop"
                if result is None:
                    result = self.loop.cancel(step.slot)
            elif result is not None:
                reason = "stop" if result.stop == "eos" else "length"
            if reason is None:  # hold back what may still become a stop string, or a split character
                hold = max((len(s) - 1 for s in req.stops), default=0)
                safe = len(text) - hold
                while safe > req.sent and text[safe - 1] == "\ufffd":
                    safe -= 1
                text = text[:safe]
            if len(text) > req.sent:
                req.emit("text", text[req.sent:])
                req.sent = len(text)
            if reason is not None:
                self.running.pop(step.slot, None)
                req.finished = True
                self._finished(req, reason)
                req.emit("done", {"finish_reason": reason,
                                  "usage": {"prompt_tokens": len(req.job.prompt), "completion_tokens": len(req.tokens),
                                            "total_tokens": len(req.job.prompt) + len(req.tokens)},
                                  "vskip": vskip_block(result, (req.job.policy or self.loop.policy).name)})
        except Exception as e:  # noqa: BLE001 - this request fails alone
            self._fail(req, ApiError(500, f"this request failed: {type(e).__name__}: {e}", "internal_error"))
            self._finished(req, "error")
            self._end(step.slot)


def _timeout(seconds) -> ApiError:
    return ApiError(504, f"the request ran past the server's --request-timeout of {seconds:g} s; its slot is freed",
                    "timeout_error")
