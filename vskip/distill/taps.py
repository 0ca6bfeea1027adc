"""The verifier's hidden states over the distillation rows, extracted once per machine for the
conditioned drafter (:mod:`vskip.engine.models.conditioned`) to train on.

The stored answers are the verifier's own greedy output, so running the verifier over a row gives
exactly the hidden states a decode of that prompt hands the drafter. For each row the outputs of
the tapped decoder layers are concatenated per position (``[T, len(layers) * d]``) and stored in
bfloat16. The forward stops after the last tapped layer.

Layout of a features directory::

    index.json          tapped layers, width, the verifier's hash, the data's fingerprint, the
                        held-out split, and one entry per chunk (rows, tokens, bytes, sha256,
                        seconds)
    chunk_NNNNN.safetensors   ``features`` bf16 [tokens, k*d], ``offsets`` int64 [rows + 1],
                        ``rows`` int64 [rows] (indices into :func:`vskip.distill.rows.load_rows`)

Chunk 0 holds the held-out rows (the training run's evaluation), the others the training rows in
a seeded random order; a rerun skips the chunks present whose size and sha256 are those the index
records (a damaged chunk is rebuilt, never kept), and ``--until`` or ``--max-rows`` bound how far
one run goes, so extraction and training can share a time budget. Training reads only chunks of
the size the index records, and names a damaged one.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..files import FileError, own_dir, write_atomic, write_json
from .rows import Data, load_rows, split
from .shards import data_fingerprint

INDEX = "index.json"
FORMAT = "vskip-taps/1"


def chunk_name(i: int) -> str:
    return f"chunk_{i:05d}.safetensors"


class _Stop(Exception):
    """Raised by the last tapped layer's hook: the layers above it are not needed."""


def tapped_forward(model, layers: tuple[int, ...]):
    """A function ``ids [1, T] -> features [T, len(layers) * d]`` (float32) that runs the causal
    LM ``model`` only as far as its last tapped layer. Layer ``i`` means transformers'
    ``hidden_states[i + 1]``: the output of decoder layer ``i``, final-normed for the last layer."""
    base = model.model
    grabbed: dict[int, torch.Tensor] = {}
    last, top = max(layers), len(base.layers) - 1

    def hook(i):
        def fn(_module, _inp, out):
            h = out[0] if isinstance(out, tuple) else out
            grabbed[i] = base.norm(h) if i == top else h  # hidden_states[-1] is final-normed
            if i == last:
                raise _Stop
        return fn

    def run(ids: torch.Tensor) -> torch.Tensor:
        handles = [base.layers[i].register_forward_hook(hook(i)) for i in layers]
        grabbed.clear()
        try:
            with torch.inference_mode():
                base(input_ids=ids, use_cache=False)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return torch.cat([grabbed[i][0] for i in layers], dim=-1).float()

    return run


class RowFeatures(Mapping):
    """Row index -> its features (bf16 [T, k*d]), read from the chunk files on demand (a slice
    of one tensor each), so that training on every row does not hold them all in memory."""

    def __init__(self, out: Path, chunks: list[dict]):
        from safetensors import SafetensorError, safe_open

        self._files, self._where = [], {}
        for entry in chunks:
            path = Path(out) / entry["file"]
            if chunk_damage(path, entry, hash_it=False):
                raise FileError(f"{path} is {chunk_damage(path, entry, hash_it=False)}: rerun vskip extract-features "
                                f"on {out} to rebuild it")
            try:
                f = safe_open(str(path), framework="pt")
            except SafetensorError as e:
                raise FileError(f"{path} is not a readable safetensors file ({e}): rerun vskip extract-features "
                                f"on {out} to rebuild it") from None
            off = f.get_tensor("offsets").tolist()
            for j, r in enumerate(f.get_tensor("rows").tolist()):
                self._where[int(r)] = (len(self._files), off[j], off[j + 1])
            self._files.append(f)

    def __getitem__(self, row: int) -> torch.Tensor:
        i, a, b = self._where[row]
        return self._files[i].get_slice("features")[a:b]

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


@dataclass
class Taps:
    """Features of some rows, as read back: ``features[row_index]`` -> bf16 tensor [T, k*d]."""

    layers: tuple[int, ...]
    width: int
    features: Mapping
    holdout: list[int]

    def rows(self) -> list[int]:
        return sorted(self.features)


def chunk_damage(path: Path, entry: dict, hash_it: bool = True) -> str | None:
    """What is wrong with a chunk file against its index entry (missing, not a regular file, of
    another size, of another sha256 when ``hash_it`` and the entry records one), or None."""
    import os
    import stat as stat_

    from ..files import file_sha256

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if not stat_.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size != entry.get("bytes"):
        return f"{st.st_size} bytes where the index records {entry.get('bytes')}"
    if hash_it and entry.get("sha256") and file_sha256(path) != entry["sha256"]:
        return "not the bytes the index records (its sha256 differs)"
    return None


def read_index(out: Path) -> dict:
    from ..files import read_json

    return read_json(Path(out) / INDEX, "features index")


def load_taps(out: Path, max_chunks: int | None = None) -> Taps:
    """Every whole chunk of a features directory (the first ``max_chunks`` only, if given); rows
    are read when asked for."""
    idx = read_index(out)
    chunks = [e for _, e in sorted(idx.get("chunks", {}).items(), key=lambda kv: int(kv[0]))][: max_chunks]
    return Taps(tuple(idx["layers"]), int(idx["width"]), RowFeatures(Path(out), chunks), list(idx["holdout"]))


def plan_rows(data: Data, holdout: int, seed: int) -> tuple[list[int], list[int]]:
    """(held-out row indices, training row indices in extraction order), over ``data``'s rows;
    the held-out rows are those of :func:`vskip.distill.rows.split` with the same arguments."""
    idx = np.random.RandomState(seed).permutation(len(data))
    n_ho = min(holdout, len(data) // 5)
    ho = sorted(int(i) for i in idx[:n_ho])
    rest = np.random.default_rng([seed, 1]).permutation(np.asarray(sorted(set(range(len(data))) - set(ho))))
    return ho, [int(i) for i in rest]


def extract(data_dir: Path, out: Path, verifier_dir: Path, layers: tuple[int, ...], holdout: int = 64,
            seed: int = 0, chunk_rows: int = 64, max_rows: int | None = None, until: float | None = None,
            max_tokens: int | None = None, threads: int | None = None, progress: bool = True,
            device: str = "cpu") -> dict:
    """Extract (or resume extracting) the tapped hidden states of the distillation rows into
    ``out``. ``max_tokens`` cuts each row to its first tokens; ``until`` is a wall-clock time
    (``time.time()``) after which no new chunk starts. Returns the index."""
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM

    from ..engine.models.embedded import file_sha256
    from ..engine.runtime import Runtime

    Runtime(threads=threads).activate()
    out = own_dir(out)
    data = load_rows(Path(data_dir))
    ho, order = plan_rows(data, holdout, seed)
    # the same split the training run makes (a check, not a second definition)
    assert sorted(split(data, holdout, seed)[1].prompt_ids) == sorted(data.prompt_ids[i] for i in ho)
    from ..engine.models.source import transformers_dir

    model = AutoModelForCausalLM.from_pretrained(transformers_dir(str(verifier_dir)), dtype=torch.float32,
                                                 trust_remote_code=False,
                                                 local_files_only=True).eval()
    model.to(device)
    n_layers = int(model.config.num_hidden_layers)
    if not layers or max(layers) >= n_layers or min(layers) < 0 or len(set(layers)) != len(layers):
        raise ValueError(f"tapped layers must be distinct indices in 0..{n_layers - 1}, got {list(layers)}")
    settings = {"format": FORMAT, "layers": list(layers), "width": int(model.config.hidden_size),
                "verifier_sha256": _weights_sha(verifier_dir, file_sha256), "data": data_fingerprint(Path(data_dir)),
                "holdout": ho, "seed": seed, "chunk_rows": chunk_rows, "max_tokens": max_tokens}
    idx = read_index(out) if (out / INDEX).exists() else {**settings, "chunks": {}}
    for k, v in settings.items():
        if idx.get(k) != v:
            raise ValueError(f"{out} holds features made with another {k}; use a new directory")
    for key, entry in sorted(idx["chunks"].items()):  # resume keeps only the chunks that are whole
        damage = chunk_damage(out / entry.get("file", chunk_name(int(key))), entry)
        if damage:
            print(f"vskip: {out / entry.get('file', chunk_name(int(key)))} is {damage}: rebuilding it", file=sys.stderr)
            del idx["chunks"][key]
    fwd = tapped_forward(model, tuple(layers))
    plan = [ho] + [order[i : i + chunk_rows] for i in range(0, len(order), chunk_rows)]
    if max_rows is not None:
        plan = plan[: 1 + -(-max_rows // chunk_rows)]
    bar = tqdm(total=len(plan), initial=len(idx["chunks"]), desc="extract features", unit="chunk",
               disable=not progress)
    for ci, rows in enumerate(plan):
        if str(ci) in idx["chunks"]:
            continue
        if until is not None and time.time() > until:
            break
        t0 = time.time()
        parts, offsets = [], [0]
        for r in rows:
            ids = data.rows[r][:max_tokens] if max_tokens else data.rows[r]
            f = fwd(torch.from_numpy(ids.astype(np.int64))[None].to(device))
            parts.append(f.to(torch.bfloat16).cpu())
            offsets.append(offsets[-1] + f.shape[0])
        tensors = {"features": torch.cat(parts), "offsets": torch.tensor(offsets, dtype=torch.int64),
                   "rows": torch.tensor(rows, dtype=torch.int64)}
        from safetensors.torch import save_file

        name = chunk_name(ci)
        write_atomic(out / name, lambda tmp: save_file(tensors, tmp))
        idx["chunks"][str(ci)] = {"file": name, "rows": len(rows), "tokens": offsets[-1],
                                  "bytes": (out / name).stat().st_size, "sha256": file_sha256(out / name),
                                  "seconds": round(time.time() - t0, 2)}
        write_json(out / INDEX, idx)
        bar.update(1)
    bar.close()
    return idx


def _weights_sha(verifier_dir: Path, sha) -> str | None:
    meta = Path(verifier_dir) / "vskip.json"
    if meta.exists():
        d = json.loads(meta.read_text())
        return d.get("model_sha256") or d.get("sha256")
    files = sorted(Path(verifier_dir).glob("*.safetensors"))
    return sha(files[0]) if len(files) == 1 else None


def summary(idx: dict) -> dict:
    """Rows, tokens, bytes and seconds over a features directory's chunks."""
    ch = idx.get("chunks", {}).values()
    return {"chunks": len(ch), "rows": sum(c["rows"] for c in ch), "tokens": sum(c["tokens"] for c in ch),
            "bytes": sum(c["bytes"] for c in ch), "seconds": round(sum(c["seconds"] for c in ch), 1)}
