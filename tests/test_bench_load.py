"""benchmarks/bench_load.py's arithmetic: a level's summary, the medians and ratios over repeats
paired with llama-server's run of the same level and repeat, and the retry of a failed connection."""

import asyncio

import pytest
from scripts import load_script

bench = load_script("bench_load")


def _req(ttft, stamps, tokens, status=200, reason="length", t0=0.0):
    return {"t0": t0, "stamps": stamps, "ttft": ttft, "itl": [b - a for a, b in zip(stamps, stamps[1:])],
            "latency": stamps[-1] if stamps else 0.1, "tokens": tokens, "status": status, "finish_reason": reason,
            "text": "x", "attempts": 1}


def _run(cfg, clients, repeat, wall, ttfts):
    reqs = [_req(t, [t, t + 0.1, t + 0.3], 3) for t in ttfts]
    run = {"wall": wall, "requests": reqs}
    return {"config": cfg, "clients": clients, "repeat": repeat, **run, "summary": bench.summarise(run)}


def test_a_summary_counts_only_complete_requests_and_pools_the_gaps():
    run = {"wall": 2.0, "requests": [_req(0.5, [0.5, 0.6, 0.9], 3), _req(1.5, [1.5, 1.7], 2),
                                     _req(None, [], None, status="APIConnectionError", reason=None)]}
    s = bench.summarise(run)
    assert (s["n"], s["complete"], s["tokens"]) == (3, 2, 5)
    assert s["throughput"] == pytest.approx(2.5)
    assert s["ttft_p50"] == pytest.approx(1.0)
    assert s["itl_p50"] == pytest.approx(0.2)  # the gaps 0.1, 0.3 and 0.2 of both requests together


def test_ratios_pair_each_repeat_with_llama_servers_run_of_the_same_level_and_repeat():
    record = {"levels": [4], "runs": [_run("vskip:strict", 4, 0, 1.0, [0.1] * 4), _run("llamacpp", 4, 0, 2.0, [0.4] * 4),
                                      _run("vskip:strict", 4, 1, 1.0, [0.1] * 4), _run("llamacpp", 4, 1, 4.0, [0.2] * 4)]}
    rows = {r["config"]: r for r in bench.aggregate(record)}
    assert rows["vskip:strict"]["throughput_vs_llamacpp"] == pytest.approx([3.0, 2.0, 4.0])
    assert rows["vskip:strict"]["ttft_vs_llamacpp"] == pytest.approx([0.375, 0.25, 0.5])
    assert rows["vskip:strict"]["throughput"] == pytest.approx([12.0, 12.0, 12.0])
    assert "throughput_vs_llamacpp" not in rows["llamacpp"]


def test_a_connection_that_fails_before_any_answer_is_tried_once_more():
    import httpx
    from openai import APIConnectionError

    class Client:
        model_id = "m"

        def __init__(self, failures):
            self.failures, self.completions = failures, self

        async def create(self, **kw):
            if self.failures:
                self.failures -= 1
                raise APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1/v1/completions"))

            async def chunks():
                from types import SimpleNamespace as N
                yield N(choices=[N(text="a", finish_reason=None)], usage=None)
                yield N(choices=[N(text="", finish_reason="length")], usage=N(completion_tokens=1))
            return chunks()

    once = asyncio.run(bench.one(Client(1), [1, 2], 1, {}))
    assert once["status"] == 200 and once["attempts"] == 2 and once["text"] == "a"
    twice = asyncio.run(bench.one(Client(2), [1, 2], 1, {}))
    assert twice["status"] == "APIConnectionError" and twice["attempts"] == 2
