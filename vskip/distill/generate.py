"""The verifier's own greedy answers to the training prompts, stored in compact resumable shards.

Layout of an output directory::

    index.json          settings, hashes, the command, and one entry per completed shard
                        (rows, tokens, bytes, sha256): the data set's manifest
    prompts.jsonl       the ordered prompt list the shards index into (rebuilt from the offline
                        packages; not needed to train)
    shard_00000.npz     rows = prompts [0, shard_size), in list order
    shard_00001.npz     ...

Each shard is a compressed numpy archive (no pickle: every array is numeric or a string) with

* ``tokens`` uint16, flat: for each row its prompt ids (chat template applied) followed by the
  generated ids, up to and including the first eos when one was generated;
* ``offsets`` int64 [rows + 1]: row ``r`` is ``tokens[offsets[r]:offsets[r + 1]]``;
* ``prompt_lens`` int32 [rows]: how many of a row's ids are prompt;
* ``finished`` uint8 [rows]: 1 when the answer ended with eos, 0 when ``max_new_tokens`` cut it;
* ``meta``: a JSON string (``prompt_ids`` and ``sources`` as lists, the prompt-list hash, the
  settings).

Answers come from :class:`~vskip.distill.engine.SlotEngine` (continuous batching, exact greedy
head); all shards still to do stream through one engine, each shard's prompts sorted by length,
so the slots stay full across shard boundaries. A shard is written to a temporary file and
renamed once all its rows are in, so it is either complete or absent; a rerun with the same
settings skips completed shards, so a killed run loses at most the shards in flight. Shards of
format 1 (safetensors, int32) are still read.

Run it in the background with, for example::

    nohup vskip generate-data --out datasets/distill --threads 2 > gen.log 2>&1 &

and resume by running the same command again.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Sequence

from vskip.distill.prompts import (SOURCES, TrainPrompt, build_prompts, count_by_source, prompts_hash, read_prompts,
                                   write_prompts)
from vskip.distill.shards import (FORMAT_VERSION, INDEX_FILE, PROMPTS_FILE, RESUME_KEYS, file_sha256, read_index,
                                  read_shard, shard_name, write_shard)
from vskip.files import DirLock, own_dir, write_atomic

# --------------------------------------------------------------------------------------------
# Generation


def trim_completion(generated: Sequence[int], eos_id: int) -> tuple[list[int], bool]:
    """Generated ids up to and including the first eos, and whether there was one."""
    generated = list(generated)
    if eos_id in generated:
        return generated[: generated.index(eos_id) + 1], True
    return generated, False


def generate_batch(model, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int,
                   pad_id: int, eos_id: int) -> list[dict]:
    """Greedy answers through transformers' ``generate`` (left-padded batch): the reference the
    engine is checked against, and the baseline of ``benchmarks/bench_generate.py``."""
    import torch

    width = max(len(p) for p in prompt_ids)
    input_ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        input_ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p) :] = 1
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                             pad_token_id=pad_id, eos_token_id=eos_id, temperature=None, top_p=None, top_k=None)
    rows = []
    for i, p in enumerate(out[:, width:].tolist()):
        completion, finished = trim_completion(p, eos_id)
        rows.append({"prompt": list(prompt_ids[i]), "completion": completion, "finished": finished})
    return rows


def _tokenizer(verifier_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(verifier_dir), trust_remote_code=False, local_files_only=True)


def _verifier_hashes(verifier_dir: Path) -> dict:
    from vskip.engine.models.embedded import file_sha256 as sha
    from vskip.engine.models.source import gguf_file

    weights = gguf_file(verifier_dir) or verifier_dir / "model.safetensors"  # the file the engine reads
    out = {"verifier_sha256": sha(weights)}
    marker = verifier_dir / "vskip.json"
    if marker.exists():
        try:
            out["verifier_source_sha256"] = json.loads(marker.read_text()).get("sha256")
        except ValueError:
            pass
    return out


def _special_ids(tokenizer, config: dict) -> tuple[int, int]:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if not isinstance(eos, int) or eos == tokenizer.unk_token_id or eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        eos = config.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) else eos
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    return int(eos), int(pad)


def _shard_is_done(path: Path, settings: dict, needed_rows: int) -> bool:
    if not path.exists():
        return False
    try:
        meta = read_shard(path)["meta"]
    except ValueError:  # an unreadable shard is regenerated
        return False
    return (
        meta.get("prompts_sha256") == settings["prompts_sha256"]
        and meta.get("max_new_tokens") == settings["max_new_tokens"]
        and meta.get("rows", -1) >= needed_rows
    )


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"


def _plan(out_dir: Path, settings: dict, total: int, shard_size: int, shards: dict) -> list[tuple[int, int, int]]:
    """(shard, first prompt, rows) of each shard still to generate; completed ones are recorded
    in ``shards``."""
    todo = []
    for s in range(math.ceil(total / shard_size)):
        start = s * shard_size
        needed = min(start + shard_size, total) - start
        path = out_dir / shard_name(s)
        if _shard_is_done(path, settings, needed):
            if s not in shards:  # a shard written before the index caught up
                shards[s] = _shard_entry(path)
            continue
        shards.pop(s, None)
        todo.append((s, start, needed))
    return todo


def _shard_entry(path: Path, **extra) -> dict:
    shard = read_shard(path)
    n_prompt = int(shard["prompt_lens"].sum())
    return {"file": path.name, "rows": int(len(shard["prompt_lens"])),
            "answer_tokens": int(len(shard["tokens"]) - n_prompt), "prompt_tokens": n_prompt,
            "finished": int(shard["finished"].sum()), "bytes": path.stat().st_size,
            "sha256": file_sha256(path), **extra}


def generate_distillation(
    out_dir: Path | str,
    prompts: Sequence[TrainPrompt],
    verifier_dir: Path | str,
    max_new_tokens: int = 384,
    slots: int = 64,
    threads: int = 1,
    shard_size: int = 256,
    limit: int | None = None,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Generate (or resume generating) the verifier's greedy answers to ``prompts``.

    Shard ``i`` holds prompts ``[i * shard_size, (i + 1) * shard_size)`` of the list; only the
    first ``limit`` prompts are processed when ``limit`` is given. Completed shards are skipped.
    ``slots``: how many answers the engine decodes at once. Returns the index (also written to
    ``out_dir/index.json``).
    """
    from vskip.engine.models.backbone import read_hf_config

    from .engine import SlotEngine, load_causal_lm

    out_dir, verifier_dir = Path(out_dir), Path(verifier_dir)
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts")
    if shard_size < 1 or slots < 1 or max_new_tokens < 1 or threads < 1:
        raise ValueError("shard_size, slots, max_new_tokens and threads must be positive")
    own_dir(out_dir)
    from vskip.engine.runtime import Runtime

    Runtime(threads=threads).activate()

    with DirLock(out_dir, "data directory"):
        settings = {
            "format": FORMAT_VERSION,
            "prompts_sha256": prompts_hash(prompts),
            "num_prompts": len(prompts),
            "counts": count_by_source(prompts),
            "shard_size": shard_size,
            "max_new_tokens": max_new_tokens,
            **_verifier_hashes(verifier_dir),
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
            runs = list(index.get("runs", []))
        else:
            shards, runs = {}, []
        prompts_file = out_dir / PROMPTS_FILE
        if not prompts_file.exists() or prompts_hash(read_prompts(prompts_file)) != settings["prompts_sha256"]:
            write_prompts(prompts, prompts_file)
        tokenizer = _tokenizer(verifier_dir)
        eos_id, pad_id = _special_ids(tokenizer, read_hf_config(verifier_dir))

        def save_index() -> dict:
            data = {**settings, "eos_id": eos_id, "pad_id": pad_id, "runs": runs,
                    "shards": {str(k): shards[k] for k in sorted(shards)}}
            write_atomic(out_dir / INDEX_FILE, json.dumps(data, indent=1))
            return data

        total = len(prompts) if limit is None else max(0, min(limit, len(prompts)))
        todo = _plan(out_dir, settings, total, shard_size, shards)
        if not todo:
            return save_index()
        runs.append({"command": command, "slots": slots, "threads": threads, "started": time.strftime("%Y-%m-%dT%H:%M:%S")})
        save_index()
        engine = SlotEngine(load_causal_lm(verifier_dir, threads), slots=slots, max_new_tokens=max_new_tokens,
                            eos_id=eos_id)
        return _stream(engine, tokenizer, prompts, todo, out_dir, settings, shards, runs, save_index, progress)


def _stream(engine, tokenizer, prompts, todo, out_dir, settings, shards, runs, save_index, progress) -> dict:
    """Decode every shard still to do through one engine and write each as soon as it is whole."""
    from tqdm import tqdm

    from vskip.engine.prompting import encode_chat

    def feed():
        # shard by shard, each shard's prompts shortest first
        for s, start, needed in todo:
            encoded = [(start + i, encode_chat(tokenizer, prompts[start + i].text)) for i in range(needed)]
            yield from sorted(encoded, key=lambda kv: (len(kv[1]), kv[0]))

    n_todo = sum(n for _, _, n in todo)
    pending = {s: {} for s, _, _ in todo}
    shard_of = {start + i: (s, start, needed) for s, start, needed in todo for i in range(needed)}
    tty = sys.stderr.isatty()
    bar = tqdm(total=n_todo, unit="prompt", disable=not progress, dynamic_ncols=True,
               mininterval=1.0 if tty else 60.0, smoothing=0.05)
    t0 = time.time()
    stats = {"answer_tokens": 0, "prompt_tokens": 0, "prompts": 0}
    print(f"[distill] {len(todo)} shard(s), {n_todo} prompt(s) to generate into {out_dir}",
          file=sys.stderr, flush=True)
    index = None
    try:
        for ans in engine.run(feed()):
            s, start, needed = shard_of[ans.key]
            pending[s][ans.key - start] = {"prompt": ans.prompt, "completion": ans.completion,
                                           "finished": ans.finished}
            stats["answer_tokens"] += len(ans.completion)
            stats["prompt_tokens"] += len(ans.prompt)
            stats["prompts"] += 1
            elapsed = time.time() - t0
            bar.set_postfix(tok_s=f"{stats['answer_tokens'] / max(elapsed, 1e-9):.0f}", shard=s, refresh=False)
            bar.update(1)
            if len(pending[s]) < needed:
                continue
            got = pending.pop(s)
            rows = [got[i] for i in range(needed)]
            items = prompts[start : start + needed]
            meta = {"format": FORMAT_VERSION, "shard": s, "start": start,
                    "prompt_ids": [p.prompt_id for p in items], "sources": [p.source for p in items],
                    "prompts_sha256": settings["prompts_sha256"],
                    "verifier_sha256": settings["verifier_sha256"],
                    "max_new_tokens": settings["max_new_tokens"], "eos_id": engine.eos}
            path = out_dir / shard_name(s)
            write_shard(path, rows, meta)
            shards[s] = _shard_entry(path)
            runs[-1].update(seconds=round(elapsed, 1), **stats)
            index = save_index()
            rate = stats["prompts"] / max(elapsed, 1e-9)
            print(f"[distill] shard {s} written ({shards[s]['answer_tokens']} answer tokens, "
                  f"{shards[s]['bytes'] / 1e3:.0f} kB); overall {stats['prompts']}/{n_todo} prompts, "
                  f"{stats['answer_tokens'] / max(elapsed, 1e-9):.1f} answer tok/s, "
                  f"time left {_fmt_time((n_todo - stats['prompts']) / rate if rate else float('inf'))}",
                  file=sys.stderr, flush=True)
    finally:
        bar.close()
    return index if index is not None else save_index()


# --------------------------------------------------------------------------------------------
# The engine against transformers


def check_agreement(verifier_dir: Path, prompts: Sequence[TrainPrompt], max_new_tokens: int = 128,
                    slots: int = 8) -> dict:
    """Answers of the slot engine versus transformers' greedy ``generate``, one prompt at a time
    (the decoding ``vskip run --policy ar`` matches): how many differ, and where."""
    import torch
    from transformers import AutoModelForCausalLM

    from vskip.engine.models.backbone import read_hf_config
    from vskip.engine.prompting import encode_chat

    from .engine import SlotEngine, load_causal_lm

    tokenizer = _tokenizer(verifier_dir)
    eos_id, pad_id = _special_ids(tokenizer, read_hf_config(verifier_dir))
    encoded = [encode_chat(tokenizer, p.text) for p in prompts]
    engine = SlotEngine(load_causal_lm(verifier_dir), slots=slots, max_new_tokens=max_new_tokens, eos_id=eos_id)
    ours = {a.key: a.completion for a in engine.run(enumerate(encoded))}
    from vskip.engine.models.source import transformers_dir

    hf = AutoModelForCausalLM.from_pretrained(str(transformers_dir(str(verifier_dir))), dtype=torch.float32, trust_remote_code=False,
                                              local_files_only=True).eval()
    diffs, same = [], 0
    total = 0
    for i, (p, e) in enumerate(zip(prompts, encoded)):
        a = ours[i]
        b = generate_batch(hf, [e], max_new_tokens, pad_id, eos_id)[0]["completion"]
        n = min(len(a), len(b))
        first = next((j for j in range(n) if a[j] != b[j]), None)
        if first is None and len(a) != len(b):
            first = n
        same += n if first is None else first
        total += max(len(a), len(b))
        if first is not None:
            diffs.append({"prompt_id": p.prompt_id, "first_diff": first, "engine_len": len(a), "hf_len": len(b)})
    return {"prompts": len(prompts), "differ": len(diffs), "diffs": diffs,
            "shared_prefix_fraction": same / max(total, 1), "max_new_tokens": max_new_tokens}


# --------------------------------------------------------------------------------------------
# Command line


def resolve_prompts(out: str | Path, prompts_file: str | None = None, sources: Sequence[str] = SOURCES,
                    seed: int = 0) -> list[TrainPrompt]:
    """The prompt list to answer: ``prompts_file`` when given, else the one ``out`` already holds,
    else the list built from the offline packages."""
    if prompts_file:
        return read_prompts(Path(prompts_file))
    existing = Path(out) / PROMPTS_FILE
    if existing.exists():
        return read_prompts(existing)
    return build_prompts(tuple(sources), seed=seed)
