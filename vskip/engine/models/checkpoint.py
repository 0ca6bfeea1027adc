"""What a drafter directory is checked with before any weights load (the kinds: :mod:`.drafter_check`).

Every file read as a configuration or as weights must be a regular file (a FIFO or a device
would block the read, a directory named like a file fails late and unclearly), and every
configuration a JSON object whose integer fields are integers within the model's limits: the
block size (a draft is at most :data:`~vskip.defaults.MAX_GAMMA` tokens), the tapped layers
(the verifier's), the mask token (the vocabulary's), the widths (the verifier's). Then the
tensors the safetensors headers announce (read alone, never the weights) are compared, by name
and shape, with those the drafter's own module expects, built on the meta device: head counts,
widths, ``fc`` against the tapped layers, the vocabulary; no tensor may be in two files. A
failure names the file and the field, and is bad input (exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...defaults import MAX_GAMMA
from ...files import FileError, check_regular_file

#: the most layers, and the widest width, a drafter's configuration may ask the meta model for
MAX_LAYERS, MAX_WIDTH = 1024, 1 << 20
#: the largest safetensors header read (the published DFlash and Dream headers are a few hundred KB)
MAX_HEADER = 64 << 20


def read_config(path: Path, what: str = "configuration") -> dict:
    """A JSON object from a regular file; anything else refuses with one line naming the file."""
    check_regular_file(path, what)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except RecursionError:
        raise FileError(f"{what} {path} nests too deeply") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise FileError(f"{what} {path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise FileError(f"{what} {path} is a JSON {type(data).__name__}, not an object")
    return data


def int_field(where: Path, field: str, value, lo: int, hi: int) -> int:
    """``value`` of ``field`` in ``where``: an integer (not a float, not a bool) in ``lo..hi``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: {field} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{where}: {field} {value} lies outside {lo}..{hi}")
    return value


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from a safetensors file's header alone, checked against the file's size."""
    check_regular_file(path, "drafter weights")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 0 < n <= min(size - 8, MAX_HEADER):
            raise FileError(f"{path} is not a readable safetensors file (its header length does not fit the file)")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError):
            raise FileError(f"{path} is not a readable safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise FileError(f"{path} is not a readable safetensors file (its header is not an object)")
    shapes = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        shape, offsets = (t.get("shape"), t.get("data_offsets")) if isinstance(t, dict) else (None, None)
        ok = isinstance(shape, list) and all(type(x) is int and x >= 0 for x in shape)
        ok = ok and isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int for x in offsets)
        if not ok or not 0 <= offsets[0] <= offsets[1] <= size - 8 - n:
            raise FileError(f"{path}: tensor {name} has no valid shape or place in the file")
        shapes[name] = tuple(shape)
    return shapes


def weights_shapes(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, Path]]:
    """The tensors of several safetensors files, and the file of each; a tensor in two files refuses."""
    shapes: dict[str, tuple[int, ...]] = {}
    owner: dict[str, Path] = {}
    for f in files:
        for name, shape in safetensors_shapes(f).items():
            if name in owner:
                raise FileError(f"tensor {name} is in both {owner[name]} and {f}: which one loads is not defined")
            shapes[name], owner[name] = shape, f
    return shapes, owner


#: the configuration fields a tensor's shape follows from, by a part of its name
_FIELDS = (("fc.", "target_layer_ids and hidden_size"), ("_proj", "num_attention_heads, num_key_value_heads, "
           "head_dim, hidden_size"), ("mlp", "intermediate_size and hidden_size"), ("norm", "hidden_size or head_dim"),
           ("embed", "vocab_size and hidden_size"), ("lm_head", "vocab_size and hidden_size"))


def compare_shapes(expected: dict, found: dict, owner: dict, config: Path, optional=()) -> None:
    """The tensors ``found`` in the files (``owner``: each one's file) against those the module
    built from ``config`` expects: none missing (but ``optional``), none unexpected, every shape
    equal. Refuses with the file, the tensor and the configuration fields it follows from."""
    for name, shape in found.items():
        if name not in expected:
            raise ValueError(f"{owner[name]}: tensor {name} is not part of the drafter {config} describes")
        if tuple(expected[name]) != tuple(shape):
            fields = next((f for key, f in _FIELDS if key in name), "its layout")
            raise ValueError(f"{owner[name]}: tensor {name} has shape {list(shape)}, but {config} ({fields}) "
                             f"gives {list(expected[name])}")
    missing = sorted(set(expected) - set(found) - set(optional))
    if missing:
        files = sorted({str(p) for p in owner.values()}) or ["no weights file"]
        raise ValueError(f"{', '.join(files)}: tensors {missing[:3]} that {config} describes are missing")


def meta_shapes(module_factory) -> dict[str, tuple[int, ...]]:
    """{name: shape} of the state of the module ``module_factory()`` builds on the meta device."""
    import torch

    with torch.device("meta"):
        module = module_factory()
    return {k: tuple(v.shape) for k, v in module.state_dict().items() if v is not None}


def max_block(what: Path, field: str, block) -> int:
    """A conditioned drafter's block: the last token and at least one mask, at most a draft of
    :data:`MAX_GAMMA` tokens (a larger one would compute that many positions every round)."""
    return int_field(what, field, block, 2, MAX_GAMMA + 1)
