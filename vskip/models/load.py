"""Loading a drafter/verifier pair: the embedded default, or local checkpoint directories.

Nothing here reaches a model hub (``HF_HUB_OFFLINE`` is set) and no code from a checkpoint runs
(``trust_remote_code`` stays off; the drafter is read from safetensors into our own module).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..defaults import STEPS
from ..runtime import Runtime
from .copy import COPY_FILE, CopyPrior
from .drafter import DiffusionDrafter, is_dream_checkpoint, load_drafter_model
from .embedded import EMBEDDED_DRAFTER, EMBEDDED_VERIFIER, embedded_drafter_dir, embedded_verifier_dir, file_sha256
from .attention import use_gqa_attention
from .verifier import HFVerifier

#: Above this share of shared ids that decode differently, a drafter's vocabulary does not fit.
MAX_VOCAB_MISMATCH = 0.01


@dataclass
class ModelPair:
    drafter: DiffusionDrafter | None
    verifier: HFVerifier
    tokenizer: object
    identity: dict


def _offline():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def resolve_verifier_dir(verifier: str | None) -> Path:
    if verifier in (None, "", "default", EMBEDDED_VERIFIER):
        return embedded_verifier_dir()
    p = Path(verifier)
    if not p.exists():
        raise FileNotFoundError(f"verifier path {verifier} does not exist")
    if not (p / "config.json").exists():
        raise ValueError(f"verifier path {verifier} has no config.json (a transformers checkpoint directory is expected)")
    return p


def load_verifier(path: Path, runtime: Runtime, use_cache: bool = True):
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=runtime.torch_dtype(), trust_remote_code=False)
    model.to(runtime.device)
    if runtime.device == "cpu":
        use_gqa_attention(model)
    eos = set()
    for src in (tok.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if src is None:
            continue
        eos |= set(src) if isinstance(src, (list, tuple)) else {src}
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    return HFVerifier(model, sorted(eos), sorted(special), use_cache=use_cache), tok


def check_prompt_fits(verifier: str | None, prompt: str | list[tuple[str, str]], max_new_tokens: int) -> int:
    """Tokenize the prompt (or the ``(name, prompt)`` pairs of a task) with the verifier's
    tokenizer alone and refuse, before any model loads, when one of them and ``max_new_tokens``
    exceed the verifier's context. Returns the longest prompt's length."""
    from transformers import AutoTokenizer

    from ..prompting import encode_chat

    _offline()
    vdir = resolve_verifier_dir(verifier)
    tok = AutoTokenizer.from_pretrained(vdir)
    items = [(None, prompt)] if isinstance(prompt, str) else list(prompt)
    limit = json.loads((Path(vdir) / "config.json").read_text()).get("max_position_embeddings")
    longest = 0
    for name, text in items:
        n = len(encode_chat(tok, text))
        longest = max(longest, n)
        if limit and n + max_new_tokens > int(limit):
            which = "the prompt" if name is None else f"prompt {name}"
            raise ValueError(f"{which} is {n} tokens; with --max-new-tokens {max_new_tokens} it exceeds the "
                             f"verifier's context of {limit} tokens")
    return longest


def vocabulary_fit(drafter_tok, verifier_tok, head_ids: torch.Tensor, verifier_len: int) -> torch.Tensor:
    """Which head outputs may be proposed: ids the verifier's vocabulary has, decoding to the same
    string in both tokenizers. Raises when the vocabularies do not fit at all."""
    ids = head_ids.tolist()
    allowed = torch.tensor([i < verifier_len for i in ids])
    if drafter_tok is None:
        return allowed
    d = drafter_tok.convert_ids_to_tokens([i for i in ids if i < min(verifier_len, len(drafter_tok))])
    v = verifier_tok.convert_ids_to_tokens([i for i in ids if i < min(verifier_len, len(drafter_tok))])
    same = {i for i, a, b in zip(ids, d, v) if a == b}
    mismatch = 1.0 - len(same) / max(len(d), 1)
    if mismatch > MAX_VOCAB_MISMATCH:
        raise ValueError(
            f"the drafter's vocabulary does not fit the verifier: {mismatch:.1%} of shared token ids decode differently"
        )
    return torch.tensor([i in same for i in ids])


def verify_drafter(ddir: Path, vdir: Path, required: bool = False) -> None:
    """Check a drafter directory's files against its ``manifest.json`` before loading them: the
    weights' and the copy prior's sha256 must match (a damaged file refuses with one line saying
    how to rebuild it). ``required``: the manifest itself must be there and whole (the embedded
    drafter ships one). Warns when the drafter was distilled from another verifier file."""
    from ..files import FileError, read_json
    from .embedded import file_sha256

    path = Path(ddir) / "manifest.json"
    if not path.exists():
        if required:
            raise FileError(f"{path} is missing: the drafter cannot be checked; reinstall vskip")
        return
    try:
        m = read_json(path, "drafter manifest")
    except FileError:
        if required:
            raise FileError(f"drafter manifest {path} is damaged; reinstall vskip") from None
        raise
    for key, rebuild in (("weights", "reinstall vskip or re-export it (vskip train-drafter --export)"),
                         ("copy_prior", "refit it (vskip fit-copy-prior) or reinstall vskip")):
        entry = m.get(key) if isinstance(m, dict) else None
        if not isinstance(entry, dict) or "file" not in entry or "sha256" not in entry:
            if required and key == "weights":
                raise FileError(f"drafter manifest {path} records no weights hash; reinstall vskip")
            continue
        f = Path(ddir) / entry["file"]
        if not f.exists():
            if key == "weights":
                raise FileNotFoundError(f"drafter weights {f} are missing; {rebuild}")
            continue
        if file_sha256(f) != entry["sha256"]:
            raise FileError(f"{f} does not match the sha256 in {path}: the file is damaged; {rebuild}")
    try:
        want = m["verifier"]["verifier_source_sha256"]
        have = json.loads((Path(vdir) / "vskip.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if want != have:
        print(f"vskip: warning: the drafter was distilled from verifier {want[:12]}, "
              f"but {vdir} holds {have[:12]}", file=sys.stderr)


def resolve_copy_prior(choice: str | None, drafter_dir: Path | None) -> CopyPrior | None:
    """The copy prior named by ``--copy-prior`` (see :func:`load_pair`)."""
    if choice in (None, "off", "none"):
        return None
    if choice == "auto":
        path = Path(drafter_dir) / COPY_FILE if drafter_dir is not None else None
        if path is None or not path.exists():
            return None
    else:
        path = Path(choice)
        if path.is_dir():
            path = path / COPY_FILE
        if not path.exists():
            raise FileNotFoundError(f"copy prior {choice} does not exist")
    try:
        data = json.loads(path.read_text())
        prior = CopyPrior.from_json(data)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a copy prior: {e}") from None
    return replace(prior, meta=prior.meta | {"sha256": file_sha256(path)})


def load_pair(
    runtime: Runtime,
    drafter: str | None = None,
    verifier: str | None = None,
    steps: int = STEPS,
    use_cache: bool = True,
    need_drafter: bool = True,
    reveal: str | None = None,
    copy_prior: str | None = "auto",
) -> ModelPair:
    """The verifier (embedded default or a directory) and, when asked, the drafter.

    ``copy_prior``: ``auto`` uses the drafter directory's ``copy_prior.json`` when it has one,
    ``off`` (or None) none, anything else is the path of a copy-prior file."""
    runtime.activate()
    if need_drafter and runtime.dtype != "float32":
        print(f"vskip: note: the verifier runs in {runtime.dtype}: its argmax can round differently in a "
              f"block verification than in a one-token step, so Strict SDD is not guaranteed "
              f"to equal ar token for token (use --dtype float32 for that)", file=sys.stderr)
    if need_drafter and drafter not in (None, "", "default", EMBEDDED_DRAFTER) and not Path(drafter).exists():
        raise FileNotFoundError(f"drafter path {drafter} does not exist")
    vdir = resolve_verifier_dir(verifier)
    ver, tok = load_verifier(vdir, runtime, use_cache)
    identity = {"verifier": EMBEDDED_VERIFIER if verifier in (None, "", "default") else str(verifier)}
    d_adapter = None
    if need_drafter:
        if drafter in (None, "", "default", EMBEDDED_DRAFTER):
            ddir = embedded_drafter_dir()
            if (ddir / "drafter.json").exists():
                verify_drafter(ddir, vdir, required=True)
                model = load_drafter_model(ddir, base_dir=vdir, dtype=runtime.torch_dtype("drafter"), device=runtime.device)
                identity["drafter"] = EMBEDDED_DRAFTER
            else:
                from .drafter import drafter_from_verifier

                print("vskip: no trained embedded drafter found; using an untrained one built from the verifier", file=sys.stderr)
                model = drafter_from_verifier(vdir).to(device=runtime.device, dtype=runtime.torch_dtype("drafter"))
                identity["drafter"] = EMBEDDED_DRAFTER + "-untrained"
            dtok = None
        else:
            ddir = Path(drafter)
            verify_drafter(ddir, vdir)
            model = load_drafter_model(ddir, base_dir=vdir, dtype=runtime.torch_dtype("drafter"), device=runtime.device)
            identity["drafter"] = str(drafter)
            dtok = None
            if is_dream_checkpoint(ddir) and (ddir / "tokenizer_config.json").exists():
                from transformers import AutoTokenizer

                dtok = AutoTokenizer.from_pretrained(ddir)
            elif model.spec.backbone.vocab_size != ver.vocab_size:
                raise ValueError(
                    f"the drafter's vocabulary ({model.spec.backbone.vocab_size}) does not fit the verifier's ({ver.vocab_size})"
                )
        head_ids = model.head_token_ids().cpu()
        allowed = vocabulary_fit(dtok, tok, head_ids, len(tok))
        if model.spec.mask_token_id is not None:
            allowed &= head_ids != model.spec.mask_token_id
        allowed &= torch.tensor([i not in ver.special_ids for i in head_ids.tolist()])
        prior = resolve_copy_prior(copy_prior, ddir)
        if prior is not None:
            identity["copy_prior"] = prior.meta.get("sha256", "custom")
        d_adapter = DiffusionDrafter(model, steps=steps, allowed=allowed.to(runtime.device), reveal=reveal,
                                     copy=prior, banned=sorted(ver.special_ids))
    return ModelPair(d_adapter, ver, tok, identity)
