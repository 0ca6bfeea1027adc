"""The verifier's own greedy answers to the training prompts, stored in resumable shards.

Layout of an output directory::

    index.json                  settings, hashes, and one entry per completed shard
    prompts.jsonl               the ordered prompt list the shards index into
    shard_00000.safetensors     rows = prompts [0, shard_size), in list order
    shard_00001.safetensors     ...

Each shard is a safetensors file (no pickle) with

* ``tokens`` int32, flat: for each row its prompt ids (chat template applied) followed by the
  generated ids, up to and including the first ``<|im_end|>`` (eos) when one was generated;
* ``offsets`` int64 [rows + 1]: row ``r`` is ``tokens[offsets[r]:offsets[r + 1]]``;
* ``prompt_lens`` int64 [rows]: how many of a row's ids are prompt;
* ``finished`` uint8 [rows]: 1 when the answer ended with eos, 0 when ``max_new_tokens`` cut it;
* optionally ``topk_ids`` int32 and ``topk_logprobs`` float16, [generated ids, k]: the
  verifier's top-k log-probabilities at each generated position, in the order of the generated
  ids of the rows (row ``r`` owns ``offsets[r + 1] - offsets[r] - prompt_lens[r]`` of them);

and string metadata (``prompt_ids`` and ``sources`` as JSON lists, the prompt-list hash, the
settings). A shard is written to a temporary file and renamed, so it is either complete or
absent; a rerun with the same settings skips completed shards, so a killed run loses at most
the shard in flight. Within a shard, prompts are sorted by token length before batching to
limit padding; the rows are stored back in list order.

Run it in the background with, for example::

    nohup python -m vskip.distill.generate --out data/distill --threads 1 \
        > data/distill/gen.log 2>&1 &

and resume by running the same command again.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from vskip.distill.prompts import (
    SOURCES,
    TrainPrompt,
    build_prompts,
    count_by_source,
    prompts_hash,
    read_prompts,
    write_prompts,
)

FORMAT_VERSION = 1
INDEX_FILE = "index.json"
PROMPTS_FILE = "prompts.jsonl"
#: Settings that must match for a rerun to reuse existing shards.
RESUME_KEYS = ("format", "prompts_sha256", "num_prompts", "shard_size", "max_new_tokens", "topk",
               "verifier_sha256")


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


# --------------------------------------------------------------------------------------------
# Reading


def read_shard(path: Path) -> dict:
    """A shard's arrays (numpy) and its decoded metadata (``prompt_ids``, ``sources``, ...)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata() or {})
        arrays = {k: f.get_tensor(k) for k in f.keys()}
    for key in ("prompt_ids", "sources"):
        if key in meta:
            meta[key] = json.loads(meta[key])
    for key in ("format", "rows", "shard", "start", "topk", "max_new_tokens", "batch_size",
                "eos_id"):
        if key in meta:
            meta[key] = int(meta[key])
    return {**arrays, "meta": meta}


def shard_rows(shard: dict) -> Iterator[dict]:
    """The rows of a read shard: prompt id, source, prompt ids, generated ids, finished flag."""
    tokens, offsets, plens = shard["tokens"], shard["offsets"], shard["prompt_lens"]
    meta = shard["meta"]
    gen_at = 0
    for r in range(len(plens)):
        row = tokens[offsets[r] : offsets[r + 1]]
        p = int(plens[r])
        n_gen = len(row) - p
        out = {
            "prompt_id": meta["prompt_ids"][r],
            "source": meta["sources"][r],
            "prompt": row[:p],
            "completion": row[p:],
            "finished": bool(shard["finished"][r]),
        }
        if "topk_ids" in shard:
            out["topk_ids"] = shard["topk_ids"][gen_at : gen_at + n_gen]
            out["topk_logprobs"] = shard["topk_logprobs"][gen_at : gen_at + n_gen]
        gen_at += n_gen
        yield out


def iter_distillation(out_dir: Path) -> Iterator[dict]:
    """Every stored row of an output directory, shard by shard, in prompt-list order."""
    out_dir = Path(out_dir)
    for path in sorted(out_dir.glob("shard_*.safetensors")):
        yield from shard_rows(read_shard(path))


def read_index(out_dir: Path) -> dict | None:
    path = Path(out_dir) / INDEX_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


# --------------------------------------------------------------------------------------------
# Writing


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(path: Path, rows: Sequence[dict], meta: dict, topk: int = 0) -> None:
    """Write rows (``prompt``, ``completion``, ``finished`` and, with topk, ``topk_ids`` and
    ``topk_logprobs``) as one shard, atomically (temporary file, fsync, rename)."""
    from safetensors.numpy import save_file

    lens = [len(r["prompt"]) + len(r["completion"]) for r in rows]
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(lens)
    tokens = np.zeros(int(offsets[-1]), dtype=np.int32)
    for r, row in enumerate(rows):
        seq = np.concatenate([np.asarray(row["prompt"]), np.asarray(row["completion"])])
        tokens[offsets[r] : offsets[r + 1]] = seq.astype(np.int32)
    arrays = {
        "tokens": tokens,
        "offsets": offsets,
        "prompt_lens": np.asarray([len(r["prompt"]) for r in rows], dtype=np.int64),
        "finished": np.asarray([bool(r["finished"]) for r in rows], dtype=np.uint8),
    }
    if topk:
        ids = [np.asarray(r["topk_ids"], dtype=np.int32).reshape(-1, topk) for r in rows]
        lps = [np.asarray(r["topk_logprobs"], dtype=np.float16).reshape(-1, topk) for r in rows]
        arrays["topk_ids"] = np.concatenate(ids) if ids else np.zeros((0, topk), np.int32)
        arrays["topk_logprobs"] = np.concatenate(lps) if lps else np.zeros((0, topk), np.float16)
    str_meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(arrays, str(tmp), metadata=str_meta)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextmanager
def _lock(out_dir: Path):
    """An exclusive lock on the output directory, so two runs never write the same shards."""
    import fcntl

    f = open(out_dir / ".lock", "w")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another run is writing {out_dir}") from None
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()


# --------------------------------------------------------------------------------------------
# Generation


class _TopK:
    """A logits processor that records the top-k log-probabilities of each step's logits."""

    def __init__(self, k: int):
        self.k = k
        self.ids: list = []
        self.logprobs: list = []

    def __call__(self, input_ids, scores):
        import torch

        lp = torch.log_softmax(scores.float(), dim=-1).topk(self.k, dim=-1)
        self.ids.append(lp.indices.to(torch.int32))
        self.logprobs.append(lp.values.to(torch.float16))
        return scores


def trim_completion(generated: Sequence[int], eos_id: int) -> tuple[list[int], bool]:
    """Generated ids up to and including the first eos, and whether there was one."""
    generated = list(generated)
    if eos_id in generated:
        return generated[: generated.index(eos_id) + 1], True
    return generated, False


def generate_batch(model, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                   pad_id: int, eos_id: int, topk: int = 0) -> list[dict]:
    """Greedy answers to a batch of prompts (token ids), left-padded, through ``model.generate``."""
    import torch

    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    kwargs = dict(
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    recorder = None
    if topk:
        from transformers import LogitsProcessorList

        recorder = _TopK(topk)
        kwargs["logits_processor"] = LogitsProcessorList([recorder])
    with torch.inference_mode():
        out = model.generate(input_ids, **kwargs)
    gen = out[:, width:].tolist()
    rows = []
    for i, p in enumerate(prompt_ids):
        completion, finished = trim_completion(gen[i], eos_id)
        row = {"prompt": list(p), "completion": completion, "finished": finished}
        if recorder is not None:
            n = len(completion)
            row["topk_ids"] = torch.stack([s[i] for s in recorder.ids[:n]]).numpy() if n else np.zeros((0, topk), np.int32)
            row["topk_logprobs"] = torch.stack([s[i] for s in recorder.logprobs[:n]]).numpy() if n else np.zeros((0, topk), np.float16)
        rows.append(row)
    return rows


def _load_verifier(verifier_dir: Path, threads: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(str(verifier_dir))
    model = AutoModelForCausalLM.from_pretrained(str(verifier_dir), dtype=torch.float32)
    model.eval()
    return model, tokenizer


def _verifier_hashes(verifier_dir: Path) -> dict:
    from vskip.models.embedded import file_sha256

    out = {"verifier_sha256": file_sha256(verifier_dir / "model.safetensors")}
    marker = verifier_dir / "vskip.json"
    if marker.exists():
        try:
            out["verifier_source_sha256"] = json.loads(marker.read_text()).get("sha256")
        except ValueError:
            pass
    return out


def _special_ids(tokenizer, model) -> tuple[int, int]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(eos, int) or eos == tokenizer.unk_token_id or eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        eos = model.config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return int(eos), int(pad)


def _shard_is_done(path: Path, settings: dict, needed_rows: int) -> bool:
    if not path.exists():
        return False
    try:
        meta = read_shard(path)["meta"]
    except Exception:  # noqa: BLE001 - an unreadable shard is regenerated
        return False
    return (
        meta.get("prompts_sha256") == settings["prompts_sha256"]
        and meta.get("max_new_tokens") == settings["max_new_tokens"]
        and meta.get("topk") == settings["topk"]
        and meta.get("rows", -1) >= needed_rows
    )


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def generate_distillation(
    out_dir: Path | str,
    prompts: Sequence[TrainPrompt],
    verifier_dir: Path | str,
    max_new_tokens: int = 384,
    batch_size: int = 16,
    threads: int = 1,
    shard_size: int = 256,
    limit: int | None = None,
    topk: int = 0,
    progress: bool = True,
) -> dict:
    """Generate (or resume generating) the verifier's greedy answers to ``prompts``.

    Shard ``i`` holds prompts ``[i * shard_size, (i + 1) * shard_size)`` of the list; only the
    first ``limit`` prompts are processed when ``limit`` is given. Completed shards are skipped.
    ``topk`` > 0 also stores the verifier's top-``topk`` log-probabilities (float16) at every
    generated position. Returns the index (also written to ``out_dir/index.json``).
    """
    import torch

    out_dir = Path(out_dir)
    verifier_dir = Path(verifier_dir)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts")
    if shard_size < 1 or batch_size < 1 or max_new_tokens < 1:
        raise ValueError("shard_size, batch_size and max_new_tokens must be positive")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(threads)

    with _lock(out_dir):
        settings = {
            "format": FORMAT_VERSION,
            "prompts_sha256": prompts_hash(prompts),
            "num_prompts": len(prompts),
            "counts": count_by_source(prompts),
            "shard_size": shard_size,
            "max_new_tokens": max_new_tokens,
            "topk": int(topk),
            **_verifier_hashes(verifier_dir),
            "verifier_dir": str(verifier_dir),
        }
        index = read_index(out_dir)
        if index is not None:
            clash = [k for k in RESUME_KEYS if index.get(k) != settings.get(k)]
            if clash:
                raise ValueError(
                    f"{out_dir} holds a run with other settings ({', '.join(clash)} differ); "
                    "use another output directory or the same settings"
                )
            shards = {int(k): v for k, v in index.get("shards", {}).items()}
        else:
            shards = {}
        prompts_file = out_dir / PROMPTS_FILE
        if not prompts_file.exists() or prompts_hash(read_prompts(prompts_file)) != settings["prompts_sha256"]:
            write_prompts(prompts, prompts_file)

        def save_index() -> dict:
            data = {**settings, "batch_size": batch_size, "eos_id": eos_id, "pad_id": pad_id,
                    "shards": {str(k): shards[k] for k in sorted(shards)}}
            _atomic_write_text(out_dir / INDEX_FILE, json.dumps(data, indent=1))
            return data

        total = len(prompts) if limit is None else max(0, min(limit, len(prompts)))
        n_shards = math.ceil(total / shard_size)
        todo = []
        for s in range(n_shards):
            start = s * shard_size
            needed = min(start + shard_size, total) - start
            path = out_dir / shard_name(s)
            if _shard_is_done(path, settings, needed):
                if s not in shards:  # a shard written before the index caught up
                    meta = read_shard(path)["meta"]
                    shards[s] = {"file": path.name, "rows": meta["rows"]}
                continue
            shards.pop(s, None)
            todo.append((s, start, needed))

        model, tokenizer = _load_verifier(verifier_dir, threads)
        eos_id, pad_id = _special_ids(tokenizer, model)
        index = save_index()
        if not todo:
            return index

        from tqdm import tqdm

        from vskip.prompting import encode_chat

        n_todo = sum(n for _, _, n in todo)
        tty = sys.stderr.isatty()
        bar = tqdm(total=n_todo, unit="prompt", disable=not progress, dynamic_ncols=True,
                   mininterval=1.0 if tty else 60.0, smoothing=0.05)
        t0 = time.time()
        new_tokens = 0
        done_prompts = 0
        print(f"[distill] {len(todo)} shard(s), {n_todo} prompt(s) to generate into {out_dir}",
              file=sys.stderr, flush=True)
        try:
            for s, start, needed in todo:
                t_shard = time.time()
                items = prompts[start : start + needed]
                encoded = [encode_chat(tokenizer, p.text) for p in items]
                order = sorted(range(len(items)), key=lambda i: (len(encoded[i]), i))
                rows: list[dict | None] = [None] * len(items)
                shard_tokens = 0
                for b in range(0, len(order), batch_size):
                    batch = order[b : b + batch_size]
                    results = generate_batch(model, [encoded[i] for i in batch], max_new_tokens,
                                             pad_id, eos_id, topk=topk)
                    for i, row in zip(batch, results):
                        rows[i] = row
                        shard_tokens += len(row["completion"])
                    new_tokens += sum(len(r["completion"]) for r in results)
                    done_prompts += len(batch)
                    elapsed = time.time() - t0
                    bar.set_postfix(tok_s=f"{new_tokens / max(elapsed, 1e-9):.1f}", shard=s)
                    bar.update(len(batch))
                meta = {
                    "format": FORMAT_VERSION,
                    "shard": s,
                    "start": start,
                    "rows": len(items),
                    "prompt_ids": [p.prompt_id for p in items],
                    "sources": [p.source for p in items],
                    "prompts_sha256": settings["prompts_sha256"],
                    "verifier_sha256": settings["verifier_sha256"],
                    "max_new_tokens": max_new_tokens,
                    "topk": int(topk),
                    "batch_size": batch_size,
                    "eos_id": eos_id,
                }
                path = out_dir / shard_name(s)
                write_shard(path, rows, meta, topk=topk)
                seconds = time.time() - t_shard
                shards[s] = {"file": path.name, "rows": len(items), "new_tokens": shard_tokens,
                             "finished": sum(bool(r["finished"]) for r in rows),
                             "seconds": round(seconds, 1)}
                index = save_index()
                elapsed = time.time() - t0
                rate = done_prompts / max(elapsed, 1e-9)
                left = (n_todo - done_prompts) / rate if rate > 0 else float("inf")
                print(
                    f"[distill] shard {s}: {len(items)} prompts, {shard_tokens} new tokens in "
                    f"{seconds:.0f}s ({shard_tokens / max(seconds, 1e-9):.1f} tok/s); overall "
                    f"{done_prompts}/{n_todo} prompts, {new_tokens / max(elapsed, 1e-9):.1f} tok/s, "
                    f"time left {_fmt_time(left)}",
                    file=sys.stderr, flush=True,
                )
        finally:
            bar.close()
        return index


# --------------------------------------------------------------------------------------------
# Batched versus unbatched greedy output


def compare_batched(model, tokenizer, prompts: Sequence[TrainPrompt], max_new_tokens: int = 128,
                    batch_size: int | None = None) -> dict:
    """Greedy answers to ``prompts`` in one left-padded batch versus one at a time.

    Returns how many answers differ, and for each differing one the first position that does.
    """
    from vskip.prompting import encode_chat

    eos_id, pad_id = _special_ids(tokenizer, model)
    encoded = [encode_chat(tokenizer, p.text) for p in prompts]
    batch_size = batch_size or len(encoded)
    batched: list[list[int]] = []
    for b in range(0, len(encoded), batch_size):
        batched += [r["completion"] for r in
                    generate_batch(model, encoded[b : b + batch_size], max_new_tokens, pad_id, eos_id)]
    single = [generate_batch(model, [e], max_new_tokens, pad_id, eos_id)[0]["completion"] for e in encoded]
    diffs = []
    same_tokens = total_tokens = 0
    for p, a, b in zip(prompts, batched, single):
        n = min(len(a), len(b))
        first = next((i for i in range(n) if a[i] != b[i]), None)
        if first is None and len(a) != len(b):
            first = n
        prefix = n if first is None else first
        same_tokens += prefix
        total_tokens += max(len(a), len(b))
        if first is not None:
            diffs.append({"prompt_id": p.prompt_id, "first_diff": first, "batched_len": len(a),
                          "single_len": len(b)})
    return {"prompts": len(prompts), "differ": len(diffs), "diffs": diffs,
            "prompt_lens": [len(e) for e in encoded],
            "shared_prefix_fraction": same_tokens / max(total_tokens, 1)}


# --------------------------------------------------------------------------------------------
# Command line


def _resolve_prompts(args) -> list[TrainPrompt]:
    if args.prompts:
        return read_prompts(Path(args.prompts))
    existing = Path(args.out) / PROMPTS_FILE
    if existing.exists():
        return read_prompts(existing)
    return build_prompts(tuple(args.sources.split(",")), seed=args.seed)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m vskip.distill.generate",
        description="Greedy answers of the verifier to the training prompts (resumable shards).",
    )
    ap.add_argument("--out", required=True, help="output directory (rerun with it to resume)")
    ap.add_argument("--prompts", help="prompt list (JSONL); default: OUT/prompts.jsonl when it "
                    "exists, else the built list")
    ap.add_argument("--sources", default=",".join(SOURCES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verifier", help="verifier directory; default: the embedded verifier")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--shard-size", type=int, default=256)
    ap.add_argument("--topk", type=int, default=0, help="also store top-K log-probs (float16)")
    ap.add_argument("--check-batching", type=int, default=0, metavar="N",
                    help="only compare batched with unbatched greedy output on N prompts")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)

    if args.verifier:
        verifier_dir = Path(args.verifier)
    else:
        from vskip.models.embedded import embedded_verifier_dir

        verifier_dir = embedded_verifier_dir()
    prompts = _resolve_prompts(args)
    if args.check_batching:
        import torch

        model, tokenizer = _load_verifier(verifier_dir, args.threads)
        step = max(1, len(prompts) // args.check_batching)
        sample = prompts[::step][: args.check_batching]
        t = time.time()
        report = compare_batched(model, tokenizer, sample, max_new_tokens=args.max_new_tokens,
                                 batch_size=args.batch_size)
        report["seconds"] = round(time.time() - t, 1)
        report["threads"] = torch.get_num_threads()
        print(json.dumps(report, indent=1))
        return 0
    print(f"[distill] prompts: {count_by_source(prompts)}", file=sys.stderr, flush=True)
    index = generate_distillation(
        args.out, prompts, verifier_dir,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, threads=args.threads,
        shard_size=args.shard_size, limit=args.limit, topk=args.topk,
        progress=not args.no_progress,
    )
    print(f"[distill] done: {len(index['shards'])} shard(s) in {args.out}", file=sys.stderr,
          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
