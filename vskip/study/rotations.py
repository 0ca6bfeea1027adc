"""The rotation files every learned predictor shares: one safetensors checkpoint per rotation
(weights, input normalisation and fold membership as metadata) and a ``manifest.json`` written
last; which rotation tests a prompt; and the drafter's hidden states as the predictors read them.

Both the paper's per-position MLPs (:mod:`vskip.study.predictor`) and the prefix survival model
(:mod:`vskip.study.prefix.model`) are stored and looked up through here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..files import write_atomic

MANIFEST = "manifest.json"


def rotation_file(r: int) -> str:
    return f"rotation_{r}.safetensors"


def save_rotation(path: Path, state: dict, mean: np.ndarray, std: np.ndarray, meta: dict) -> None:
    """One checkpoint: ``mlp.*`` weights, ``norm.mean``/``norm.std``, and string metadata
    (kind, gamma, d_model, rotation, test/val/train prompt ids as JSON)."""
    from safetensors.torch import save_file

    tensors = {f"mlp.{k}": v.detach().cpu().float().contiguous() for k, v in state.items()}
    tensors["norm.mean"] = torch.from_numpy(np.asarray(mean, np.float32))
    tensors["norm.std"] = torch.from_numpy(np.asarray(std, np.float32))
    md = {k: v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(path), lambda tmp: save_file(tensors, tmp, metadata=md))


def find_predictor_dir(path: str | Path, kind: str) -> Path:
    """``path/KIND`` when it holds a manifest, else ``path`` itself when its manifest is of ``kind``."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"predictor directory {p} does not exist")
    for d in (p / kind, p):
        m = d / MANIFEST
        if m.exists():
            man = json.loads(m.read_text())
            if man.get("kind") == kind:
                return d
    raise ValueError(f"no {kind} predictor under {p} (train one with `vskip train-predictor --kind {kind} --out {p}`)")


def read_rotations(path: str | Path, kind: str, fmt: str) -> tuple[Path, dict, list]:
    """The directory, manifest and checkpoints ``(file, metadata, tensors)`` of the rotations of
    ``kind`` under ``path``, refusing a manifest of another format or a missing checkpoint."""
    from safetensors import safe_open

    d = find_predictor_dir(path, kind)
    man = json.loads((d / MANIFEST).read_text())
    if man.get("format") != fmt:
        raise ValueError(f"{d / MANIFEST} is not a vskip {kind} predictor manifest")
    out = []
    for e in man["rotations"]:
        f = d / e["file"]
        if not f.exists():
            raise FileNotFoundError(f"predictor checkpoint {f} is missing")
        with safe_open(str(f), framework="pt") as sf:
            out.append((f, sf.metadata() or {}, {k: sf.get_tensor(k) for k in sf.keys()}))
    return d, man, out


def test_owners(rotations: Sequence[tuple[int, Sequence[str], Sequence[str]]], path) -> dict[str, int]:
    """{prompt id: position of the rotation that tests it} from (index, test ids, ids it trained,
    validated or calibrated on) per rotation; refuses a prompt tested twice or seen by its tester."""
    owner: dict[str, int] = {}
    for i, (index, test, seen) in enumerate(rotations):
        if set(seen) & set(test):
            raise ValueError(f"rotation {index} of {path} trains or validates on its test prompts")
        for tid in test:
            if tid in owner:
                raise ValueError(f"prompt {tid} lies in two test folds of {path}")
            owner[tid] = i
    return owner


def owner_of(owner: dict[str, int], task_id: str | None, kind: str, path) -> int:
    """The rotation (of :func:`test_owners`) that scores ``task_id``."""
    if task_id is None:
        raise ValueError("a learned predictor needs the prompt's task id to choose its fold")
    try:
        return owner[str(task_id)]
    except KeyError:
        raise ValueError(
            f"prompt {task_id} lies in no test fold of the {kind} predictor at {path} "
            f"(trained on {len(owner)} prompts); train it on traces that include this prompt"
        ) from None


def hidden_rows(block, g: int, d_model: int, device: str = "cpu") -> torch.Tensor:
    """float32 [g, d_model] hidden states of ``block``, rounded through float16 as traces store them."""
    h = block.hidden
    if h is None:
        raise ValueError("the predictor reads hidden states but the drafter gave none")
    h = torch.as_tensor(h).to(device=device).to(torch.float16).float()
    if tuple(h.shape) != (g, d_model):
        raise ValueError(f"hidden states of shape {tuple(h.shape)} do not fit a predictor trained on "
                         f"d_model = {d_model}")
    return h
