"""A bounded load test of ``vskip serve``: many clients at once, with and without verifier skipping,
beside batch-1 decoding of the same prompts (what ``vskip generate`` runs), then past capacity.

1. A server (``--max-batch``, a queue long enough for every client) takes ``--limit`` chat requests
   from ``--clients`` concurrent clients (the official ``openai`` client, asyncio, streaming), once
   per configuration (a request's ``vskip`` object), the configurations in a rotating order,
   ``--repeats`` times. Each request's time to first token and latency are read at the client;
   throughput is completion tokens over the wall time of the whole set. Every response must end
   with a finish reason and ``[DONE]``: one that does not counts as lost.
2. The same prompts decoded one at a time through the door ``vskip generate`` uses, Strict SDD, in
   the process of this script once the server has stopped: the batch-1 reference. Its time to
   first token is its latency (``generate`` prints the text when it is done).
3. Past capacity: a server with a queue of ``--overload-queue`` takes ``--overload-clients``
   requests at once; the refused ones are answered 429 at once and every admitted one finishes.

Usage::

    python benchmarks/bench_serve.py --task humaneval --limit 64 --clients 16 --max-batch 8 \\
        --max-tokens 128 --configs strict,raw --repeats 2 --out docs/results/serve
    python benchmarks/bench_serve.py --summary --out docs/results/serve   # results.md again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: a request's vskip object per configuration
CONFIGS = {
    "ar": {"policy": "ar"},
    "strict": {"policy": "strict"},
    "raw": {"policy": "raw"},  # the skip policy at its defaults (the gates of Eq. 3 the defaults give)
    "raw-paper": {"policy": "raw", "eta_b": 0.9, "eta_c": 0.93, "k_min": 6, "s_max": 64},
}


def start_server(max_batch: int, max_queue: int, threads: int, log: Path, preset: str = "default"):
    err = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "vskip", "serve", "--preset", preset, "--port", "0",
                             "--max-batch", str(max_batch),
                             "--max-queue", str(max_queue), "--threads", str(threads), "--device", "cpu",
                             "--request-timeout", "0"], stdout=subprocess.DEVNULL, stderr=err)
    for _ in range(1200):
        m = re.search(r"on (http://[\d.]+:\d+) ", log.read_text())
        if m:
            return proc, m.group(1)
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {log.read_text()}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server never said where it listens")


def stop_server(proc) -> int:
    proc.terminate()
    return proc.wait(120)


async def one(client, model: str, prompt: str, max_tokens: int, vskip: dict) -> dict:
    t0 = time.perf_counter()
    ttft, text, reason, usage, block, status = None, [], None, None, None, 200
    try:
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body={"vskip": vskip})
        async for chunk in stream:
            if chunk.choices:
                c = chunk.choices[0]
                if c.delta.content:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    text.append(c.delta.content)
                if c.finish_reason:
                    reason, block = c.finish_reason, (chunk.model_extra or {}).get("vskip")
            if chunk.usage:
                usage = chunk.usage.completion_tokens
    except Exception as e:  # noqa: BLE001 - a refusal or a failure is a result here
        status = getattr(e, "status_code", None) or type(e).__name__
    return {"ttft": ttft, "latency": time.perf_counter() - t0, "text": "".join(text), "finish_reason": reason,
            "tokens": usage, "vskip": block, "status": status}


async def load(url: str, prompts: list[str], clients: int, max_tokens: int, vskip: dict) -> dict:
    """``prompts`` through ``clients`` concurrent clients, each taking the next prompt when done."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    model = (await client.models.list()).data[0].id
    queue = list(enumerate(prompts))
    out: dict[int, dict] = {}

    async def worker():
        while queue:
            i, p = queue.pop(0)
            out[i] = await one(client, model, p, max_tokens, vskip)

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - t
    await client.close()
    return {"wall": wall, "requests": [out[i] for i in range(len(prompts))]}


async def burst(url: str, prompt: str, n: int, max_tokens: int) -> list[dict]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)
    model = (await client.models.list()).data[0].id
    res = await asyncio.gather(*(one(client, model, prompt, max_tokens, {"policy": "strict"}) for _ in range(n)))
    await client.close()
    return list(res)


def batch_one(prompts: list[str], max_tokens: int, threads: int, preset: str = "default") -> dict:
    """Each prompt decoded alone with Strict SDD through the door ``vskip generate`` uses, with the
    settings ``vskip generate --policy strict --preset PRESET`` gives."""
    from vskip.commands import build_parser
    from vskip.commands.flags import settings
    from vskip.engine.prompting import encode_chat
    from vskip.engine.door import open_decoder

    a = build_parser().parse_args(["generate", "-", "--policy", "strict", "--preset", preset, "--max-new-tokens",
                                   str(max_tokens), "--device", "cpu", "--threads", str(threads)])
    dec = open_decoder(settings(a))
    tok = dec.pair.tokenizer
    dec.warmup(encode_chat(tok, prompts[0]))
    out, t = [], time.perf_counter()
    for p in prompts:
        t0 = time.perf_counter()
        res = dec.decode(encode_chat(tok, p))
        took = time.perf_counter() - t0
        out.append({"ttft": took, "latency": took, "text": tok.decode(res.tokens, skip_special_tokens=True),
                    "tokens": res.generated_tokens, "finish_reason": "stop" if res.stop == "eos" else "length",
                    "status": 200})
    return {"wall": time.perf_counter() - t, "requests": out, "machine": dec.runtime}


def summarise(run: dict) -> dict:
    reqs = run["requests"]
    ok = [r for r in reqs if r["status"] == 200 and r["finish_reason"]]
    tokens = sum(r["tokens"] or 0 for r in ok)
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else None  # noqa: E731
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    lat = [r["latency"] for r in ok]
    skipped = [r["vskip"]["unverified_share"] for r in ok if r.get("vskip")]
    return {"n": len(reqs), "complete": len(ok), "tokens": tokens, "wall": run["wall"],
            "throughput": tokens / run["wall"], "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "latency_p50": pct(lat, 50), "latency_p99": pct(lat, 99),
            "unverified_share": float(np.mean(skipped)) if skipped else None}


def table(record: dict) -> str:
    from vskip.engine.runtime import machine_id

    rows = ["| run | repeat | complete | tokens | throughput tok/s | TTFT p50 / p99 s | latency p50 / p99 s | "
            "unverified share | = batch-1 Strict SDD |",
            "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: "–" if x is None else f"{x:.2f}"  # noqa: E731
    for run in record["runs"]:
        s = run["summary"]
        same = run.get("equal_to_batch1")
        rows.append(f"| {run['name']} | {run.get('repeat', '–')} | {s['complete']}/{s['n']} | {s['tokens']} | "
                    f"{s['throughput']:.2f} | {f(s['ttft_p50'])} / {f(s['ttft_p99'])} | "
                    f"{f(s['latency_p50'])} / {f(s['latency_p99'])} | "
                    f"{'–' if s['unverified_share'] is None else format(s['unverified_share'], '.3f')} | "
                    f"{'–' if same is None else f'{same[0]}/{same[1]}'} |")
    serve = [r for r in record["runs"] if r.get("repeat") is not None]
    one = next((r for r in record["runs"] if r.get("repeat") is None), None)
    ratios = []
    for run in serve:
        ar = next((r for r in serve if r["name"] == "serve ar" and r["repeat"] == run["repeat"]), None)
        if run is ar:
            continue
        parts = [f"{run['summary']['throughput'] / ar['summary']['throughput']:.3f}x serve ar"] if ar else []
        if one:
            parts.append(f"{run['summary']['throughput'] / one['summary']['throughput']:.3f}x batch-1 Strict SDD")
        ratios.append(f"- {run['name']}, repeat {run['repeat']}: " + ", ".join(parts))
    for run in serve:
        if run["name"] == "serve ar" and one:
            ratios.append(f"- serve ar, repeat {run['repeat']}: "
                          f"{run['summary']['throughput'] / one['summary']['throughput']:.3f}x batch-1 Strict SDD")
    o = record["overload"]
    lines = ["\n".join(rows), "", "Throughput against serve ar in the same repeat, and against batch-1 Strict SDD:",
             "\n".join(ratios), "",
             f"Past capacity: {o['clients']} requests at once to a server of batch {o['max_batch']} and queue "
             f"{o['max_queue']}: {o['ok']} answered 200 (all {o['ok_complete']} complete), {o['refused']} refused "
             f"with 429 (the slowest refusal after {o['refused_max_s']:.3f} s), {o['other']} other.", "",
             f"Server: batch {record['max_batch']}, {record['clients']} concurrent clients, {record['limit']} "
             f"{record['task']} prompts, {record['max_tokens']} tokens at most, temperature 0; the load generator "
             f"runs on the same machine. SIGTERM stopped each server with exit status "
             f"{', '.join(str(x) for x in record['exit_status'])}.", "",
             f"Machine: {machine_id(record['machine'])}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="humaneval")
    p.add_argument("--limit", type=int, default=64)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--configs", default="strict,raw")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--preset", default="default",
                   help="the server's --preset (docs/results/serve.md was measured with study: Strict SDD at gamma 8)")
    p.add_argument("--overload-clients", type=int, default=64)
    p.add_argument("--overload-queue", type=int, default=8)
    p.add_argument("--overload-tokens", type=int, default=32)
    p.add_argument("--out", required=True)
    p.add_argument("--summary", action="store_true", help="only rewrite OUT/results.md from OUT/results.json")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.summary:
        (out / "results.md").write_text(table(json.loads((out / "results.json").read_text())))
        return 0
    from vskip.bench import tasks
    from vskip.engine.runtime import machine

    out.mkdir(parents=True, exist_ok=True)
    prompts = [tasks.user_prompt(t) for t in tasks.load_task(a.task)[: a.limit]]
    configs = a.configs.split(",")
    runs, exits = [], []
    logs = Path(tempfile.mkdtemp(prefix="bench-serve-"))  # the servers' stderr, read for their address
    proc, url = start_server(a.max_batch, 10 * a.limit, a.threads, logs / "server.log", a.preset)
    try:
        for rep in range(a.repeats):
            for name in configs[rep % len(configs):] + configs[: rep % len(configs)]:  # a rotating order
                run = asyncio.run(load(url, prompts, a.clients, a.max_tokens, CONFIGS[name]))
                runs.append({"name": f"serve {name}", "repeat": rep, **run, "summary": summarise(run)})
                print(f"serve {name} repeat {rep}: {json.dumps(runs[-1]['summary'])}", flush=True)
    finally:
        exits.append(stop_server(proc))
    proc, url = start_server(a.max_batch, a.overload_queue, a.threads, logs / "server-overload.log", a.preset)
    try:
        hit = asyncio.run(burst(url, prompts[0], a.overload_clients, a.overload_tokens))
    finally:
        exits.append(stop_server(proc))
    ok = [r for r in hit if r["status"] == 200]
    refused = [r for r in hit if r["status"] == 429]
    overload = {"clients": a.overload_clients, "max_batch": a.max_batch, "max_queue": a.overload_queue,
                "ok": len(ok), "ok_complete": sum(1 for r in ok if r["finish_reason"]), "refused": len(refused),
                "refused_max_s": max((r["latency"] for r in refused), default=0.0),
                "other": len(hit) - len(ok) - len(refused)}
    print(f"overload: {json.dumps(overload)}", flush=True)
    one_by_one = batch_one(prompts, a.max_tokens, a.threads, a.preset)
    rt = one_by_one.pop("machine")
    ref = [r["text"] for r in one_by_one["requests"]]
    runs.append({"name": "batch-1 Strict SDD (vskip generate)", **one_by_one, "summary": summarise(one_by_one)})
    for run in runs[:-1]:
        if run["name"] in ("serve strict", "serve ar"):
            run["equal_to_batch1"] = [sum(r["text"] == t for r, t in zip(run["requests"], ref)), len(ref)]
    record = {"command": "python benchmarks/bench_serve.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(rt), "task": a.task, "limit": a.limit, "clients": a.clients,
              "max_batch": a.max_batch, "max_tokens": a.max_tokens, "runs": runs, "overload": overload,
              "exit_status": exits}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps({"command": record["command"], "machine": record["machine"]},
                                                indent=1) + "\n")
    text = table(record)
    (out / "results.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
