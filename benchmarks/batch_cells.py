"""Running one bench_batch cell (a configuration decoding the prompts at one batch size) and what is
measured as it runs: wall time, tokens, each prompt's latency and output, the forwards counted by
their shape (:class:`Forwards`), the peak resident memory (:class:`PeakRss`); and the float64 gap
of an output that left batch-1 ``ar``'s."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from batch_workload import PADDED  # (benchmarks/ on the path: see bench_batch.py)


class Forwards:
    """Counts the forwards of a cell by their shape, wrapping the pair's calls: the verifier's calls
    (rows x positions, the longest row's block + 1), and where the verifier is vskip's own, each
    forward it ran as it ran it: padded (rows x the longest row's new positions, tokens committed
    by skips included) or packed (rows, and the positions they held in all); the drafter's calls
    (rows), and where the drafter is vskip's own, each forward by rows x query positions (padded to
    the longest row: its block, and the context its cache lacked). Also the seconds spent inside the verifier's and the drafter's calls: what the rest of
    the decode (policy, acceptance, bookkeeping) took is the cell's wall time less these."""

    def __init__(self, pair):
        self.verifier, self.drafter, self.rows, self.packed = {}, {}, {}, {}
        self.seconds = {"verifier": 0.0, "drafter": 0.0}
        v, d = pair.verifier, pair.drafter
        score_many, propose_many = v.score_many, d.propose_many

        def scored(calls):
            key = f"{len(calls)}x{max(len(c.block) for c in calls) + 1}"
            self.verifier[key] = self.verifier.get(key, 0) + 1
            t = time.perf_counter()
            try:
                return score_many(calls)
            finally:
                self.seconds["verifier"] += time.perf_counter() - t

        def proposed(requests, *args, **kw):
            self.drafter[str(len(requests))] = self.drafter.get(str(len(requests)), 0) + 1
            t = time.perf_counter()
            try:
                return propose_many(requests, *args, **kw)
            finally:
                self.seconds["drafter"] += time.perf_counter() - t

        v.score_many, d.propose_many = scored, proposed
        forward_rows = getattr(v, "_forward_rows", None)
        if forward_rows is not None:  # vskip's verifier: each forward as it runs

            def ran(rows, starts):
                news = [len(ids) - n for (_, ids, _), n in zip(rows, starts)]
                b, T = len(rows), max(news)
                if v.packed_forward(news):
                    c = self.packed.setdefault(str(b), [0, 0])
                    c[0], c[1] = c[0] + 1, c[1] + sum(news)
                else:
                    self.rows[f"{b}x{T}"] = self.rows.get(f"{b}x{T}", 0) + 1
                return forward_rows(rows, starts)

            v._forward_rows = ran
        self.counts_rows = forward_rows is not None
        self.drafted, self.drafted_packed = {}, {}
        net = getattr(d, "model", None)
        from vskip.engine.models.drafter_body import TorchBody

        self.counts_drafts = isinstance(net, torch.nn.Module) and isinstance(getattr(d, "body", None), TorchBody)
        if self.counts_drafts:  # vskip's drafter: each forward by rows x query positions, or packed

            def drafting(_module, args):
                pack = args[5] if len(args) > 5 else None
                if pack is not None:  # rows, and the query positions they held in all
                    c = self.drafted_packed.setdefault(str(pack[2]), [0, 0])
                    c[0], c[1] = c[0] + 1, c[1] + args[0].shape[1]
                    return
                key = "x".join(map(str, args[0].shape[:2]))
                self.drafted[key] = self.drafted.get(key, 0) + 1

            net.register_forward_pre_hook(drafting)

    def take(self) -> dict:
        out = {"verifier": dict(self.verifier), "drafter": dict(self.drafter)}
        if self.counts_rows:
            out.update({"verifier_rows": dict(self.rows), "verifier_packed": {k: list(v) for k, v in self.packed.items()},
                        "seconds": dict(self.seconds)})
        if self.counts_drafts:
            out["drafter_rows"] = dict(self.drafted)
            out["drafter_packed"] = {k: list(v) for k, v in self.drafted_packed.items()}
        for part in (self.verifier, self.drafter, self.rows, self.packed, self.drafted, self.drafted_packed):
            part.clear()
        self.seconds = {"verifier": 0.0, "drafter": 0.0}
        return out


def _rss() -> int:
    """This process's resident memory in bytes (Linux)."""
    import os

    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """The highest resident memory while a block runs, sampled every 10 ms by a thread."""

    def __enter__(self):
        import threading

        self.peak, self.stop = _rss(), threading.Event()

        def sample():
            while not self.stop.wait(0.01):
                self.peak = max(self.peak, _rss())

        self.thread = threading.Thread(target=sample, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.peak = max(self.peak, _rss())


def _run_cell(decoder, prompts, batch: int, forwards: Forwards, name: str = "") -> dict:
    from vskip.engine.decode import Job

    jobs = [Job(ids, task_id=tid) for tid, ids in prompts]
    for model in (decoder.pair.verifier, decoder.pair.drafter):
        if hasattr(model, "pack"):
            model.pack = not name.endswith(PADDED)
    forwards.take()
    with PeakRss() as rss:
        t = time.perf_counter()
        out = {job.task_id: res for job, res in decoder.decode_many(jobs, batch)}
        wall = time.perf_counter() - t
    tokens = sum(r.generated_tokens for r in out.values())
    return {"wall": wall, "tokens": tokens, "throughput": tokens / wall,
            "latency": {k: r.decode_seconds for k, r in out.items()}, "outputs": {k: r.tokens for k, r in out.items()},
            "calls": sum(r.verifier_calls for r in out.values()), "skipped": sum(r.skipped_rounds for r in out.values()),
            "forwards": forwards.take(), "peak_rss": rss.peak}


def _gap(model, prompt, ref: list[int], got: list[int]) -> float | None:
    """Top-two logit gap (float64) of the verifier at the first position where ``got`` leaves ``ref``."""
    t = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if t is None:
        return None
    with torch.inference_mode():
        z = model(input_ids=torch.tensor([list(prompt) + ref[:t]])).logits[0, -1].double()
    top = z.topk(2).values
    return float(top[0] - top[1])

