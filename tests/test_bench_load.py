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


def _args(**over):
    from types import SimpleNamespace

    a = dict(vskip=["new=", "old="], tree=[], configs="new:strict,old:strict", levels="16", per_client=1, repeats=1,
             max_tokens=8)
    a.update(over)
    return SimpleNamespace(**a)


def test_a_tree_names_a_server_and_holds_a_vskip_package(tmp_path):
    from pathlib import Path

    root = str(Path(bench.__file__).parents[1])
    bench.check_args(_args(tree=[f"old={root}"]))
    with pytest.raises(SystemExit, match="NAME a --vskip name"):
        bench.check_args(_args(tree=[f"other={root}"]))
    with pytest.raises(SystemExit, match="holds no vskip package"):
        bench.check_args(_args(tree=[f"old={tmp_path}"]))


def test_a_server_of_another_tree_imports_that_trees_vskip_first(tmp_path, monkeypatch):
    import subprocess
    import sys

    tree = tmp_path / "tree"
    (tree / "vskip").mkdir(parents=True)
    (tree / "vskip" / "__init__.py").write_text("MARK = 'the other tree'\n")
    seen = {}

    def popen(cmd, **kw):
        seen.update(cmd=cmd, env=kw.get("env"))
        raise RuntimeError("stop here")

    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(RuntimeError):
        bench.start_vskip("", 2, tmp_path / "log", str(tree))
    # the command it would start, run with the same interpreter flags and environment, finds the tree's vskip,
    # whatever the working directory holds
    monkeypatch.undo()
    probe = [seen["cmd"][0], *[x for x in seen["cmd"][1:] if x == "-P"], "-c", "import vskip; print(vskip.MARK)"]
    out = subprocess.run(probe, env=seen["env"], capture_output=True, text=True, cwd=bench.__file__.rsplit("/", 2)[0])
    assert out.stdout.strip() == "the other tree", out.stderr
    monkeypatch.setattr(subprocess, "Popen", popen)
    with pytest.raises(RuntimeError):
        bench.start_vskip("", 2, tmp_path / "log")
    assert seen["env"] is None and "-P" not in seen["cmd"] and seen["cmd"][0] == sys.executable
