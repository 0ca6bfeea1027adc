"""The distillation data set's format: compressed shards of token ids, the ``index.json``
manifest, and the totals a summary reports (see :mod:`vskip.distill.generate` for the layout).
Nothing here imports torch."""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from vskip.files import file_sha256, write_atomic

FORMAT_VERSION = 2
INDEX_FILE = "index.json"
PROMPTS_FILE = "prompts.jsonl"
#: Settings that must match for a rerun to reuse existing shards.
RESUME_KEYS = ("format", "prompts_sha256", "num_prompts", "shard_size", "max_new_tokens", "verifier_sha256")
SHARD_GLOBS = ("shard_*.npz", "shard_*.safetensors")


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.npz"


def shard_files(out_dir: Path) -> list[Path]:
    """The shard files of a data directory (either format), in shard order."""
    return sorted((p for g in SHARD_GLOBS for p in Path(out_dir).glob(g)), key=lambda p: p.name)




# --------------------------------------------------------------------------------------------
# Reading


def _read_legacy(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        meta = dict(f.metadata() or {})
        arrays = {k: f.get_tensor(k) for k in f.keys() if k in ("tokens", "offsets", "prompt_lens", "finished")}
    meta = {k: v if k in ("prompts_sha256", "verifier_sha256") else json.loads(v) for k, v in meta.items()}
    return arrays, meta


def read_shard(path: Path) -> dict:
    """A shard's arrays (numpy) and its metadata (``prompt_ids``, ``sources``, ``rows`` ...).

    Raises ValueError naming the file when it is not a readable, consistent shard."""
    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            arrays, meta = _read_legacy(path)
        else:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k] for k in ("tokens", "offsets", "prompt_lens", "finished")}
                meta = json.loads(str(z["meta"]))
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a readable distillation shard ({e})") from None
    offsets = arrays["offsets"]
    rows = len(arrays["prompt_lens"])
    if len(offsets) != rows + 1 or int(offsets[-1]) != len(arrays["tokens"]) or len(arrays["finished"]) != rows \
            or len(meta.get("prompt_ids", ())) != rows:
        raise ValueError(f"{path}: inconsistent distillation shard")
    return {**arrays, "meta": meta}


def shard_rows(shard: dict) -> Iterator[dict]:
    """The rows of a read shard: prompt id, source, prompt ids, generated ids, finished flag."""
    tokens, offsets, plens = shard["tokens"], shard["offsets"], shard["prompt_lens"]
    meta = shard["meta"]
    for r in range(len(plens)):
        row = tokens[offsets[r] : offsets[r + 1]].astype(np.int64)
        p = int(plens[r])
        yield {
            "prompt_id": meta["prompt_ids"][r],
            "source": meta["sources"][r],
            "prompt": row[:p],
            "completion": row[p:],
            "finished": bool(shard["finished"][r]),
        }


def iter_distillation(out_dir: Path) -> Iterator[dict]:
    """Every stored row of a data directory, shard by shard, in prompt-list order."""
    for path in shard_files(out_dir):
        yield from shard_rows(read_shard(path))


def read_index(out_dir: Path) -> dict | None:
    path = Path(out_dir) / INDEX_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


# --------------------------------------------------------------------------------------------
# Writing




def write_shard(path: Path, rows: Sequence[dict], meta: dict) -> None:
    """Write rows (``prompt``, ``completion``, ``finished``) as one compressed shard, atomically
    (temporary file, fsync, rename). Token ids must fit in uint16."""
    seqs = [np.concatenate([np.asarray(r["prompt"], dtype=np.int64),
                            np.asarray(r["completion"], dtype=np.int64)]) for r in rows]
    tokens = np.concatenate(seqs) if seqs else np.zeros(0, np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.uint16).max):
        raise ValueError("token ids outside uint16: this vocabulary needs another shard format")
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(q) for q in seqs])
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        tokens=tokens.astype(np.uint16),
        offsets=offsets,
        prompt_lens=np.asarray([len(r["prompt"]) for r in rows], dtype=np.int32),
        finished=np.asarray([bool(r["finished"]) for r in rows], dtype=np.uint8),
        meta=np.asarray(json.dumps({**meta, "rows": len(rows)})),
    )
    write_atomic(Path(path), buf.getvalue())


# --------------------------------------------------------------------------------------------
# Summary


def ends_in_a_loop(answer, tail: int = 128, n: int = 16) -> bool:
    """Whether some run of ``n`` tokens occurs twice within the last ``tail`` tokens of ``answer``."""
    t = [int(x) for x in answer[-tail:]]
    grams = [tuple(t[i : i + n]) for i in range(len(t) - n + 1)]
    return len(grams) != len(set(grams))


def dataset_totals(out_dir: Path) -> dict:
    """Totals of a data directory's manifest (``index.json``): shards, rows, answer and prompt
    tokens, answers ended by eos, bytes on disk, per-run generation throughput; the shards'
    hashes are checked against the files."""
    out_dir = Path(out_dir)
    index = read_index(out_dir)
    if index is None:
        raise FileNotFoundError(f"{out_dir} holds no {INDEX_FILE}")
    shards = index.get("shards", {})
    bad = [e["file"] for e in shards.values()
           if not (out_dir / e["file"]).exists() or file_sha256(out_dir / e["file"]) != e.get("sha256")]
    if bad:
        raise ValueError(f"{out_dir}: shards missing or not matching their hash: {', '.join(bad)}")
    total = lambda key: int(sum(e.get(key, 0) for e in shards.values()))
    rows = total("rows")
    loops = {True: [0, 0], False: [0, 0]}  # finished -> [answers, answers ending in a loop]
    for path in shard_files(out_dir):
        for r in shard_rows(read_shard(path)):
            loops[r["finished"]][0] += 1
            loops[r["finished"]][1] += ends_in_a_loop(r["completion"])
    runs = [{"command": r.get("command"), "slots": r.get("slots"), "threads": r.get("threads"),
             "answer_tok_s": round(r["answer_tokens"] / r["seconds"], 1)}
            for r in index.get("runs", []) if r.get("seconds")]
    return {
        "prompts_in_list": index["num_prompts"], "shards": len(shards), "rows": rows,
        "answer_tokens": total("answer_tokens"), "prompt_tokens": total("prompt_tokens"),
        "finished_share": total("finished") / rows if rows else None,
        "mean_answer_tokens": total("answer_tokens") / rows if rows else None,
        "bytes": total("bytes"), "max_new_tokens": index["max_new_tokens"],
        # answers whose last 128 tokens repeat a 16-token run: a verifier caught in a loop
        "looping_share_cut": loops[False][1] / loops[False][0] if loops[False][0] else None,
        "looping_share_finished": loops[True][1] / loops[True][0] if loops[True][0] else None,
        "prompts_sha256": index["prompts_sha256"], "verifier_sha256": index["verifier_sha256"],
        "runs": runs,
    }


def data_fingerprint(data_dir: Path, shards: list[str] | None = None) -> list[dict]:
    """Name, size and sha256 of each distillation shard (all of ``data_dir``'s, or ``shards``)."""
    files = [Path(data_dir) / f for f in shards] if shards else shard_files(data_dir)
    return [{"file": f.name, "bytes": f.stat().st_size, "sha256": file_sha256(f)} for f in files]
