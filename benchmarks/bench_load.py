"""Serving under load: ``vskip serve`` beside llama.cpp's ``llama-server`` on the same GGUF file.

For each number of concurrent clients (``--levels``), each client streams ``--per-client`` requests
back to back (the official ``openai`` client, asyncio), every request a distinct prompt: HumanEval
and MBPP chat prompts alternating (``--tasks``), sent as the very token ids ``vskip generate``
decodes (``/v1/completions``), so both servers read the same prompts. Every configuration gets
the same prompts at a level; the configurations run in a rotating order, ``--repeats`` times.

Configurations are ``SERVER:POLICY`` for a vskip server (``--vskip NAME=FLAGS``, one process each;
the policy goes in each request's ``vskip`` object) and ``llamacpp`` (``llama-server``, greedy,
``--slots`` slots, the same threads). Each request records its time to first token (TTFT), the
gaps between the chunks of text it streams (inter-token latency, ITL: a vskip round may deliver
several tokens in one chunk; llama-server sends one token a chunk) and its completion tokens;
tokens/s is a level's completion tokens over its wall time. The load generator shares the
machine's cores with the server it measures.

``--tree NAME=DIR`` runs the server NAME on the vskip of another source tree (a checkout of an
earlier commit, say): two versions of the code take turns under the same load, as
``bench_trees.py`` has them take turns one prompt at a time; the record names each tree's commit.

Last, every prompt is decoded alone with Strict SDD through the door ``vskip generate`` uses, in
this script's process: each completed greedy response of a vskip server (``ar`` and ``strict``)
is checked against that text.

Usage::

    python benchmarks/bench_load.py --vskip "vskip=" --configs vskip:ar,vskip:strict,vskip:raw,llamacpp \\
        --levels 1,4,16,32 --repeats 3 --out docs/results/serve-load
    python benchmarks/bench_load.py --summary --out docs/results/serve-load   # results.md and the plot again
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: a request's vskip object per policy name
POLICIES = {"ar": {"policy": "ar"}, "strict": {"policy": "strict"}, "raw": {"policy": "raw"}}
LLAMACPP = "llamacpp"
#: llama-server's own field: no reuse of a slot's cached prompt, which a repeat of the same prompts
#: would otherwise turn into a prefill of nothing (vskip serve keeps no prompt across requests)
LLAMACPP_BODY = {"cache_prompt": False}


def start_vskip(flags: str, threads: int, log: Path, tree: str | None = None):
    """A ``vskip serve FLAGS``; ``tree``: a source tree whose vskip it runs (first on its PYTHONPATH)."""
    err = open(log, "w")
    cmd = [sys.executable, "-m", "vskip", "serve", "--port", "0", "--threads", str(threads), "--device", "cpu",
           "--request-timeout", "0", "--max-queue", "4096", *shlex.split(flags)]
    env = None
    if tree is not None:  # -P: the working directory's vskip does not come first
        path = os.environ.get("PYTHONPATH")
        env = os.environ | {"PYTHONPATH": str(Path(tree).resolve()) + (os.pathsep + path if path else "")}
        cmd.insert(1, "-P")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    for _ in range(3000):
        m = re.search(r"on (http://[\d.]+:\d+) \(batch (\d+)", log.read_text())
        if m:
            return proc, m.group(1), int(m.group(2))
        if proc.poll() is not None:
            raise SystemExit(f"vskip serve exited: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("vskip serve never said where it listens")


async def one(client, ids: list[int], max_tokens: int, extra: dict) -> dict:
    """One streamed request. A connection that fails before any answer (a keep-alive connection the
    server closed as the client reused it) is tried once more, as a client would; the clock runs
    from the first try, and ``attempts`` counts the tries."""
    from openai import APIConnectionError

    t0 = time.perf_counter()
    stamps, text, reason, tokens, status, attempts = [], [], None, None, 200, 0
    while True:
        attempts += 1
        try:
            stream = await client.completions.create(model=client.model_id, prompt=ids, max_tokens=max_tokens,
                                                     temperature=0, stream=True,
                                                     stream_options={"include_usage": True}, extra_body=extra)
            async for chunk in stream:
                if chunk.choices:
                    c = chunk.choices[0]
                    if c.text:
                        stamps.append(time.perf_counter() - t0)
                        text.append(c.text)
                    if c.finish_reason:
                        reason = c.finish_reason
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
        except APIConnectionError as e:
            if attempts < 2 and not stamps:
                continue
            status = type(e).__name__
        except Exception as e:  # noqa: BLE001 - a refusal or a failure is a result here
            status = getattr(e, "status_code", None) or type(e).__name__
        break
    return {"t0": t0, "stamps": stamps, "ttft": stamps[0] if stamps else None, "itl": list(np.diff(stamps)),
            "latency": time.perf_counter() - t0, "attempts": attempts,
            "text": "".join(text), "finish_reason": reason, "tokens": tokens, "status": status}


async def load(url: str, prompts: list[list[int]], clients: int, max_tokens: int, extra: dict) -> dict:
    """``prompts`` split among ``clients`` concurrent clients, each sending its share back to back."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    client.model_id = (await client.models.list()).data[0].id
    out: dict[int, dict] = {}

    async def worker(k: int):
        for i in range(k, len(prompts), clients):
            out[i] = await one(client, prompts[i], max_tokens, extra)

    t = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(clients)))
    wall = time.perf_counter() - t
    await client.close()
    return {"wall": wall, "requests": [out[i] for i in range(len(prompts))]}


async def stall(url: str, streams: list[list[int]], long_ids: list[int], stream_tokens: int, long_tokens: int,
                extra: dict) -> dict:
    """``streams`` decoding when one request with the long prompt ``long_ids`` arrives: the long
    request's TTFT, and the gaps in the running streams while it waits for its first token."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    client.model_id = (await client.models.list()).data[0].id
    running = [asyncio.create_task(one(client, p, stream_tokens, extra)) for p in streams]
    await asyncio.sleep(1.0)  # the streams are admitted and decoding
    long = await one(client, long_ids, long_tokens, extra)
    done = await asyncio.gather(*running)
    await client.close()
    start, first = long["t0"], long["t0"] + (long["ttft"] or long["latency"])
    gaps = []
    for r in done:  # each gap of a running stream that overlaps the long prompt's wait
        at = [r["t0"] + x for x in r["stamps"]]
        gaps += [b - a for a, b in zip(at, at[1:]) if b > start and a < first]
    return {"long_ttft": long["ttft"], "long_status": long["status"], "long_tokens": len(long_ids),
            "gap_max": max(gaps) if gaps else None, "gap_p50": float(np.median(gaps)) if gaps else None,
            "streams_complete": sum(1 for r in done if r["status"] == 200 and r["finish_reason"]),
            "streams": len(done)}


async def promises(url: str, proc, prompts: list[list[int]], streams: int, cancel: int, extra_requests: int,
                   tokens: int) -> dict:
    """What the server promises, under load: ``streams`` streams decode; ``cancel`` of them close
    mid-stream (how long until the running gauge says their slots are free); ``extra_requests``
    more arrive at once (those past the queue must be refused at once, 429 with Retry-After); then
    SIGTERM (every open stream must end with a last event and ``[DONE]``, the process exit 0)."""
    import httpx

    def gauge(text: str, name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))

    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        model = (await http.get("/v1/models")).json()["data"][0]["id"]
        started = {i: asyncio.Event() for i in range(streams + extra_requests)}
        out: dict[int, dict] = {}

        async def stream(i: int, stop_after: int | None):
            body = {"model": model, "prompt": prompts[i % len(prompts)], "max_tokens": tokens, "stream": True,
                    "temperature": 0}
            t0, events = time.perf_counter(), []
            try:
                async with http.stream("POST", "/v1/completions", json=body) as r:
                    out[i] = {"status": r.status_code, "retry_after": r.headers.get("retry-after"),
                              "answered_s": time.perf_counter() - t0}
                    async for line in r.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            started[i].set()
                            if stop_after is not None and len(events) >= stop_after:
                                break  # the client goes away mid-stream
            except httpx.HTTPError as e:
                out.setdefault(i, {})["transport_error"] = type(e).__name__
            started[i].set()
            last = events[-2] if len(events) >= 2 else None
            out[i].update(events=len(events), done=bool(events) and events[-1] == "[DONE]",
                          last_is_error=last is not None and '"error"' in last)

        tasks = [asyncio.create_task(stream(i, 3 if i < cancel else None)) for i in range(streams)]
        await asyncio.wait_for(asyncio.gather(*(started[i].wait() for i in range(streams))), 300)
        t = time.perf_counter()
        await asyncio.gather(*tasks[:cancel])
        freed = None
        while time.perf_counter() - t < 30:
            if gauge((await http.get("/metrics")).text, "vskip:num_requests_running") <= streams - cancel:
                freed = time.perf_counter() - t
                break
            await asyncio.sleep(0.005)
        more = [asyncio.create_task(stream(streams + k, None)) for k in range(extra_requests)]
        await asyncio.sleep(2.0)
        proc.terminate()
        t_term = time.perf_counter()
        await asyncio.gather(*tasks[cancel:], *more)
        code = await asyncio.to_thread(proc.wait, 120)
    rest = [out[i] for i in range(cancel, streams + extra_requests)]
    refused = [r for r in rest if r.get("status") == 429]
    admitted = [r for r in rest if r.get("status") == 200]
    return {"streams": streams, "cancelled": cancel, "freed_s": freed, "extra_requests": extra_requests,
            "refused": len(refused), "refused_max_s": max((r["answered_s"] for r in refused), default=None),
            "refused_with_retry_after": sum(1 for r in refused if r["retry_after"]),
            "open_at_sigterm": len(admitted), "ended_with_done": sum(1 for r in admitted if r["done"]),
            "ended_with_error_event": sum(1 for r in admitted if r["last_is_error"]),
            "transport_errors": sum(1 for r in rest if "transport_error" in r),
            "other_status": len(rest) - len(refused) - len(admitted),
            "exit_status": code, "exit_s": time.perf_counter() - t_term}


def summarise(run: dict) -> dict:
    reqs = run["requests"]
    ok = [r for r in reqs if r["status"] == 200 and r["finish_reason"]]
    pct = lambda xs, q: float(np.percentile(xs, q)) if len(xs) else None  # noqa: E731
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [g for r in ok for g in r["itl"]]
    tpot = [(r["latency"] - r["ttft"]) / (r["tokens"] - 1) for r in ok if r["tokens"] and r["tokens"] > 1]
    tokens = sum(r["tokens"] or 0 for r in ok)
    return {"n": len(reqs), "complete": len(ok), "tokens": tokens, "wall": run["wall"],
            "retried": sum(1 for r in reqs if r.get("attempts", 1) > 1),
            "throughput": tokens / run["wall"], "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95),
            "ttft_max": max(ttft) if ttft else None, "itl_p50": pct(itl, 50), "itl_p95": pct(itl, 95),
            "tpot_p50": pct(tpot, 50)}


def prompt_ids(tasks_: list[str], n: int) -> tuple[list[list[int]], list[str]]:
    """``n`` distinct chat prompts as token ids, the tasks' problems alternating; and their task ids."""
    from transformers import AutoTokenizer

    from vskip.bench import tasks
    from vskip.engine.models.embedded import embedded_verifier_dir
    from vskip.engine.prompting import encode_chat

    tok = AutoTokenizer.from_pretrained(embedded_verifier_dir())
    pools = [tasks.load_task(t) for t in tasks_]
    probs = [pools[i % len(pools)][i // len(pools)] for i in range(n)]
    return [encode_chat(tok, tasks.user_prompt(p)) for p in probs], [p.task_id for p in probs]


def reference(prompts: list[list[int]], max_tokens: int, threads: int) -> tuple[list[str], dict]:
    """Each prompt decoded alone with Strict SDD as ``vskip generate --max-new-tokens N`` decodes it."""
    from vskip.commands import build_parser
    from vskip.commands.flags import settings
    from vskip.engine.door import open_decoder

    a = build_parser().parse_args(["generate", "-", "--policy", "strict", "--max-new-tokens", str(max_tokens),
                                   "--device", "cpu", "--threads", str(threads)])
    dec = open_decoder(settings(a))
    tok = dec.pair.tokenizer
    dec.warmup(prompts[0])
    return [tok.decode(dec.decode(p).tokens, skip_special_tokens=True) for p in prompts], dec.runtime


def run(a) -> dict:
    from vskip.engine.models.embedded import gguf_path
    from vskip.engine.runtime import machine
    from vskip.study.llamacpp import LlamaServer, version

    from vskip.engine.models.config import ModelConfig
    from vskip.engine.door import runtime_of

    levels = [int(x) for x in a.levels.split(",")]
    configs = a.configs.split(",")
    prompts, ids = prompt_ids(a.tasks.split(","), max(levels) * a.per_client)
    logs = Path(tempfile.mkdtemp(prefix="bench-load-"))
    servers, urls, batch = {}, {}, {}
    record = {"command": "python benchmarks/bench_load.py " + " ".join(a.argv), "levels": levels,
              "per_client": a.per_client, "max_tokens": a.max_tokens, "tasks": a.tasks, "task_ids": ids,
              "vskip": dict(v.split("=", 1) for v in a.vskip), "runs": [], "exit_status": {},
              "machine": machine(runtime_of(ModelConfig(device="cpu", threads=a.threads)))}
    try:
        trees = dict(t.split("=", 1) for t in a.tree)
        if trees:
            record["trees"] = {name: tree_commit(tree) for name, tree in trees.items()}
        for name, flags in record["vskip"].items():
            servers[name], urls[name], batch[name] = start_vskip(flags, a.threads, logs / f"{name}.log", trees.get(name))
        if LLAMACPP in configs:
            slots = a.slots or max(batch.values(), default=max(levels))
            ctx = max(a.ctx, a.stall + 64) if a.stall else a.ctx
            servers[LLAMACPP] = LlamaServer(gguf_path(), a.threads, ctx=ctx, slots=slots)
            urls[LLAMACPP] = servers[LLAMACPP].url
            record["llamacpp"] = {"slots": slots, "ctx_per_slot": ctx, "version": version(servers[LLAMACPP].binary)}
        record["batch"] = batch
        if a.stall:
            run_stall(a, servers, urls, record)
            return record
        if a.promises:
            name = next(iter(record["vskip"]))
            record["promises"] = asyncio.run(promises(urls[name], servers.pop(name), prompts, max(levels), a.promises,
                                                      a.promises_extra, a.max_tokens))
            print(json.dumps(record["promises"]), flush=True)
            return record
        for rep in range(a.repeats):
            for level in levels:
                share = prompts[: level * a.per_client]
                k = (rep + level) % len(configs)
                for cfg in configs[k:] + configs[:k]:  # a rotating order
                    server, _, policy = cfg.partition(":")
                    extra = LLAMACPP_BODY if server == LLAMACPP else {"vskip": POLICIES[policy]}
                    r = asyncio.run(load(urls[server], share, level, a.max_tokens, extra))
                    entry = {"config": cfg, "clients": level, "repeat": rep, **r, "summary": summarise(r)}
                    record["runs"].append(entry)
                    s = entry["summary"]
                    print(f"{cfg:>16} clients {level:>2} rep {rep}: {s['complete']}/{s['n']} {s['throughput']:.1f} tok/s "
                          f"TTFT p50 {s['ttft_p50']:.3f} s ITL p50 {s['itl_p50'] or 0:.4f} s", flush=True)
    finally:
        for name, proc in servers.items():
            if name == LLAMACPP:
                proc.close()
            else:
                proc.terminate()
                record["exit_status"][name] = proc.wait(120)
    texts, rt = reference(prompts, a.max_tokens, a.threads)
    record["machine"] = machine(rt)
    for entry in record["runs"]:
        if entry["config"].endswith((":ar", ":strict")):
            done = [(r, t) for r, t in zip(entry["requests"], texts) if r["status"] == 200 and r["finish_reason"]]
            entry["equal_to_generate"] = [sum(r["text"] == t for r, t in done), len(done)]
    return record


def long_prompt(n: int) -> list[int]:
    """A prompt of exactly ``n`` token ids: MBPP's problems one after another, cut."""
    from transformers import AutoTokenizer

    from vskip.bench import tasks
    from vskip.engine.models.embedded import embedded_verifier_dir

    tok = AutoTokenizer.from_pretrained(embedded_verifier_dir())
    ids: list[int] = []
    for p in tasks.load_task("mbpp"):
        ids += tok(tasks.user_prompt(p) + "\n\n")["input_ids"]
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit(f"MBPP holds fewer than {n} prompt tokens")


def run_stall(a, servers: dict, urls: dict, record: dict) -> None:
    """The long-prompt scenario: per configuration and repeat, ``--stall-streams`` streams decode when
    a prompt of ``--stall`` tokens arrives."""
    configs = a.configs.split(",")
    prompts, _ = prompt_ids(a.tasks.split(","), a.stall_streams)
    long_ids = long_prompt(a.stall)
    record.update(stall=a.stall, stall_streams=a.stall_streams, stall_stream_tokens=a.stall_stream_tokens,
                  stall_runs=[])
    for rep in range(a.repeats):
        k = rep % len(configs)
        for cfg in configs[k:] + configs[:k]:
            server, _, policy = cfg.partition(":")
            extra = LLAMACPP_BODY if server == LLAMACPP else {"vskip": POLICIES[policy]}
            r = asyncio.run(stall(urls[server], prompts, long_ids, a.stall_stream_tokens, 8, extra))
            record["stall_runs"].append({"config": cfg, "repeat": rep, **r})
            print(f"{cfg:>16} rep {rep}: long TTFT {r['long_ttft']} s, largest gap {r['gap_max']} s, "
                  f"median gap {r['gap_p50']} s, streams {r['streams_complete']}/{r['streams']}", flush=True)


def stall_table(record: dict) -> str:
    runs = record["stall_runs"]
    med = lambda xs: "–" if not xs else f"{np.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"  # noqa: E731
    lines = ["| config | long prompt's TTFT s | largest gap in a running stream s | median gap s | streams complete |",
             "|---|---|---|---|---|"]
    for cfg in dict.fromkeys(r["config"] for r in runs):
        mine = [r for r in runs if r["config"] == cfg]
        pick = lambda k: [r[k] for r in mine if r[k] is not None]  # noqa: E731
        lines.append(f"| {cfg} | {med(pick('long_ttft'))} | {med(pick('gap_max'))} | {med(pick('gap_p50'))} | "
                     f"{sum(r['streams_complete'] for r in mine)}/{sum(r['streams'] for r in mine)} |")
    return "\n".join(lines) + "\n"


def aggregate(record: dict) -> list[dict]:
    """Per configuration and level: medians over the repeats (with min and max) and, per repeat,
    the ratio of tokens/s and of median TTFT to llama-server's at the same level and repeat."""
    rows = []
    runs = record["runs"]
    for cfg in dict.fromkeys(r["config"] for r in runs):
        for level in record["levels"]:
            mine = sorted((r for r in runs if r["config"] == cfg and r["clients"] == level), key=lambda r: r["repeat"])
            if not mine:
                continue
            s = [r["summary"] for r in mine]
            row = {"config": cfg, "clients": level, "repeats": len(mine),
                   "complete": sum(x["complete"] for x in s), "n": sum(x["n"] for x in s),
                   "retried": sum(x.get("retried", 0) for x in s)}
            for key in ("throughput", "ttft_p50", "ttft_p95", "itl_p50", "itl_p95", "tpot_p50"):
                vals = [x[key] for x in s if x[key] is not None]
                row[key] = [float(np.median(vals)), min(vals), max(vals)] if vals else None
            base = {r["repeat"]: r["summary"] for r in runs if r["config"] == LLAMACPP and r["clients"] == level}
            if cfg != LLAMACPP and base:
                tp = [r["summary"]["throughput"] / base[r["repeat"]]["throughput"] for r in mine if r["repeat"] in base]
                tt = [r["summary"]["ttft_p50"] / base[r["repeat"]]["ttft_p50"] for r in mine if r["repeat"] in base]
                row["throughput_vs_llamacpp"] = [float(np.median(tp)), min(tp), max(tp)]
                row["ttft_vs_llamacpp"] = [float(np.median(tt)), min(tt), max(tt)]
            eq = [r["equal_to_generate"] for r in mine if "equal_to_generate" in r]
            if eq:
                row["equal_to_generate"] = [sum(e[0] for e in eq), sum(e[1] for e in eq)]
            rows.append(row)
    return rows


def table(record: dict) -> str:
    from vskip.engine.runtime import machine_id

    f = lambda v, d=2: "–" if v is None else f"{v[0]:.{d}f} [{v[1]:.{d}f}, {v[2]:.{d}f}]"  # noqa: E731
    ms = lambda v: "–" if v is None else f"{1000 * v[0]:.1f} [{1000 * v[1]:.1f}, {1000 * v[2]:.1f}]"  # noqa: E731
    lines = ["| config | clients | complete | tokens/s | TTFT p50 s | TTFT p95 s | ITL p50 ms | ITL p95 ms | "
             "TPOT p50 ms | tok/s ÷ llama-server | TTFT p50 ÷ llama-server | = vskip generate |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in record["aggregate"]:
        eq = r.get("equal_to_generate")
        again = f" ({r['retried']} tried twice)" if r.get("retried") else ""
        lines.append(f"| {r['config']} | {r['clients']} | {r['complete']}/{r['n']}{again} | {f(r['throughput'], 1)} | "
                     f"{f(r['ttft_p50'])} | {f(r['ttft_p95'])} | {ms(r['itl_p50'])} | {ms(r['itl_p95'])} | "
                     f"{ms(r['tpot_p50'])} | {f(r.get('throughput_vs_llamacpp'), 3)} | "
                     f"{f(r.get('ttft_vs_llamacpp'), 3)} | {'–' if eq is None else f'{eq[0]}/{eq[1]}'} |")
    lc = record.get("llamacpp")
    foot = [f"Medians over {max(r['repeats'] for r in record['aggregate'])} repeats [min, max]; each client sends "
            f"{record['per_client']} requests back to back, {record['max_tokens']} tokens at most, temperature 0, "
            f"{record['tasks']} prompts alternating. vskip servers: "
            + "; ".join(f"{k}: `vskip serve {v}` (batch {record['batch'][k]})" for k, v in record["vskip"].items())]
    if record.get("trees"):
        foot.append("Source trees: " + "; ".join(f"{k}: commit {v}" for k, v in record["trees"].items())
                    + " (the other servers: this checkout).")
    if lc:
        foot.append(f"llama-server {lc['version']}: {lc['slots']} slots of {lc['ctx_per_slot']} tokens, greedy, "
                    "cache_prompt off.")
    foot.append("A request whose connection failed before any answer was tried once more; its clock runs from "
                "the first try.")
    foot.append(f"SIGTERM exit status of the vskip servers: {record['exit_status']}.")
    foot.append(f"Machine: {machine_id(record['machine'])}")
    return "\n".join(lines) + "\n\n" + "\n".join(foot) + "\n"


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for cfg in dict.fromkeys(r["config"] for r in record["aggregate"]):
        rows = [r for r in record["aggregate"] if r["config"] == cfg]
        x = [r["clients"] for r in rows]
        for ax, key in ((ax1, "ttft_p50"), (ax2, "throughput")):
            y = [r[key][0] for r in rows]
            err = [[r[key][0] - r[key][1] for r in rows], [r[key][2] - r[key][0] for r in rows]]
            ax.errorbar(x, y, yerr=err, marker="o", capsize=3, label=cfg)
    ax1.set(xscale="log", yscale="log", xlabel="concurrent streaming clients", ylabel="median time to first token (s)")
    ax2.set(xscale="log", xlabel="concurrent streaming clients", ylabel="completion tokens/s")
    for ax in (ax1, ax2):
        ax.set_xticks(record["levels"], [str(v) for v in record["levels"]])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle("vskip serve and llama-server under load (medians over repeats, min-max bars)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(record: dict, out: Path) -> None:
    from vskip.files import write_atomic, write_json

    write_json(out / "config.json", {"command": record["command"], "machine": record["machine"]})
    if "promises" in record:
        from vskip.engine.runtime import machine_id

        write_json(out / "results.json", record)
        rows = "\n".join(f"| {k} | {v} |" for k, v in record["promises"].items())
        write_atomic(out / "results.md", f"| what | value |\n|---|---|\n{rows}\n\nServer: `vskip serve "
                                        f"{next(iter(record['vskip'].values()))}`; {record['max_tokens']} tokens a "
                                        f"stream at most.\n\nMachine: {machine_id(record['machine'])}\n")
        return
    if "stall_runs" in record:
        from vskip.engine.runtime import machine_id

        write_json(out / "results.json", record)
        lc = record.get("llamacpp")
        write_atomic(
            out / "results.md", stall_table(record) + f"\nMedians over the repeats [min, max]. {record['stall_streams']} streams (at most "
            f"{record['stall_stream_tokens']} tokens each) decoding when one prompt of {record['stall']} tokens "
            f"arrives (8 tokens asked of it); vskip servers: "
            + "; ".join(f"{k}: `vskip serve {v}`" for k, v in record["vskip"].items())
            + (f"; llama-server {lc['version']}, {lc['slots']} slots" if lc else "")
            + f".\n\nMachine: {machine_id(record['machine'])}\n")
        return
    record["aggregate"] = aggregate(record)
    for run in record["runs"]:  # each chunk's time is kept as the gaps after the first
        for r in run["requests"]:
            r.pop("stamps", None), r.pop("t0", None)
            r["itl"] = [round(g, 6) for g in r["itl"]]  # microseconds
    write_atomic(out / "results.json", json.dumps(record, separators=(",", ":")) + "\n")
    write_atomic(out / "results.md", table(record))
    plot(record, out / "load.png")


def tree_commit(tree: str) -> str:
    """The commit a source tree is checked out at (``+`` where it has changes), or ``unknown``."""
    git = ["git", "-C", tree]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                               check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.strip() + ("+" if dirty.strip() else "")


def check_args(a) -> None:
    """One line naming what is wrong, before any server starts."""
    names = set()
    for v in a.vskip:
        name, eq, _ = v.partition("=")
        if not eq or not name or name == LLAMACPP:
            raise SystemExit(f"--vskip {v!r}: expected NAME=FLAGS, NAME not {LLAMACPP!r}")
        names.add(name)
    for t in a.tree:
        name, eq, tree = t.partition("=")
        if not eq or name not in names:
            raise SystemExit(f"--tree {t!r}: expected NAME=DIR with NAME a --vskip name ({', '.join(sorted(names))})")
        if not (Path(tree) / "vskip" / "__init__.py").is_file():
            raise SystemExit(f"--tree {t!r}: {tree} holds no vskip package (a checkout of this repository)")
    for cfg in a.configs.split(","):
        server, _, policy = cfg.partition(":")
        if cfg != LLAMACPP and (server not in names or policy not in POLICIES):
            raise SystemExit(f"--configs: {cfg!r} is neither {LLAMACPP} nor SERVER:POLICY with SERVER a --vskip name "
                             f"({', '.join(sorted(names)) or 'none given'}) and POLICY one of {', '.join(POLICIES)}")
    try:
        levels = [int(x) for x in a.levels.split(",")]
    except ValueError:
        raise SystemExit(f"--levels {a.levels!r}: expected whole numbers separated by commas") from None
    if min(levels) < 1 or a.per_client < 1 or a.repeats < 1 or a.max_tokens < 1:
        raise SystemExit("--levels, --per-client, --repeats and --max-tokens must be at least 1")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vskip", action="append", default=[],
                   help="NAME=FLAGS: a vskip server started with `vskip serve FLAGS` (repeatable)")
    p.add_argument("--tree", action="append", default=[],
                   help="NAME=DIR: the --vskip server NAME runs the vskip of the source tree DIR (a checkout, "
                        "e.g. `git worktree add /tmp/base HEAD~1`): two versions of the code under the same load")
    p.add_argument("--configs", default="vskip:ar,vskip:strict,vskip:raw,llamacpp")
    p.add_argument("--levels", default="1,4,16,32")
    p.add_argument("--per-client", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--tasks", default="humaneval,mbpp")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--slots", type=int, help="llama-server's slots (default: the vskip servers' largest batch)")
    p.add_argument("--ctx", type=int, default=1024, help="llama-server's context per slot")
    p.add_argument("--stall", type=int, default=0,
                   help="instead of the levels: a prompt of this many tokens arriving while --stall-streams decode")
    p.add_argument("--stall-streams", type=int, default=4)
    p.add_argument("--stall-stream-tokens", type=int, default=512)
    p.add_argument("--promises", type=int, default=0,
                   help="instead of the levels: the largest level's streams, this many of them cancelled, "
                        "--promises-extra more requests at once, then SIGTERM (one vskip server)")
    p.add_argument("--promises-extra", type=int, default=40)
    p.add_argument("--out", required=True)
    p.add_argument("--summary", action="store_true", help="only rewrite OUT/results.md and the plot from results.json")
    a = p.parse_args(argv)
    a.argv = argv if argv is not None else sys.argv[1:]
    out = Path(a.out)
    if a.summary:
        from vskip.files import read_json

        write(read_json(out / "results.json", "a results file of bench_load.py"), out)
        return 0
    if not a.vskip and any(c != LLAMACPP for c in a.configs.split(",")):
        a.vskip = ["vskip="]
    check_args(a)
    out.mkdir(parents=True, exist_ok=True)
    record = run(a)
    write(record, out)
    print((out / "results.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
