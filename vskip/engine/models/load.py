"""Loading a drafter/verifier pair: the embedded default, or local checkpoints (a ``.gguf`` file or
a transformers directory for the verifier), after the files are checked and a memory plan says
they fit. The verifier's loaders are :mod:`.verifiers`, the drafter's files :mod:`.drafter_files`,
the vocabulary's fit :mod:`.vocab`.

Nothing here reaches a model hub (every read is ``local_files_only``) and no code from a checkpoint runs
(``trust_remote_code`` stays off; the drafter is read from safetensors into our own module).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...defaults import GAMMA, MAX_NEW_TOKENS, STEPS
from ..runtime import Runtime, parse_max_memory
from .conditioned_io import is_conditioned
from .drafter import DiffusionDrafter
from .drafter_check import check_drafter_dir
from .drafter_files import _warn_if_fitted_elsewhere, resolve_copy_prior, resolve_drafter_dir, verify_drafter
from .drafter_io import is_dream_checkpoint, load_drafter_model
from .embedded import EMBEDDED_CONDITIONED, EMBEDDED_DRAFTER, EMBEDDED_VERIFIER, embedded_drafter_dir
from .placement import MemoryPlan, MemoryPlanError, plan_memory
from .verifier import HFVerifier
from .verifiers import (UNTRAINED, check_prompt_fits, load_native_verifier, load_verifier,  # noqa: F401 - also read from here
                        native_reason, resolve_verifier_dir)
from .vocab import read_token_table, vocabulary_fit


@dataclass
class ModelPair:
    drafter: DiffusionDrafter | None
    verifier: HFVerifier
    tokenizer: object
    identity: dict
    runtime: Runtime | None = None
    plan: MemoryPlan | None = None
    #: more drafters beside the verifier, by name (``vskip compare``'s ``drafter=``)
    extra_drafters: dict = field(default_factory=dict)


#: the sequence a memory plan assumes when the caller knows no prompt: prompt, new tokens, block
DEFAULT_BUDGET = (1024, MAX_NEW_TOKENS, GAMMA)


def plan_pair(runtime: Runtime, vdir: Path, ddir: Path | None, use_cache: bool,
              budget: tuple[int, int, int] | None = None, show: bool | None = None) -> MemoryPlan:
    """The memory plan of this pair and placement (:mod:`vskip.engine.models.placement`), printed to
    stderr when a GPU or a spread verifier is involved (or ``show``); refuses with one line
    (:class:`MemoryPlanError`) when it cannot fit."""
    if ddir is not None and not ((Path(ddir) / "drafter.json").exists() or is_dream_checkpoint(ddir)
                                or is_conditioned(ddir)):
        ddir = None  # an untrained drafter built from the verifier: a few layers of it
    prompt, new, gamma, *rest = budget or DEFAULT_BUDGET
    plan = plan_memory(
        vdir, ddir, verifier_device=runtime.verifier_on, drafter_device=runtime.drafter_on, dtype=runtime.dtype,
        drafter_dtype=runtime.drafter_dtype or runtime.dtype, prompt_tokens=prompt, max_new_tokens=new,
        gamma=gamma, verifier_cache=use_cache, capacity=parse_max_memory(runtime.max_memory),
        batch=rest[0] if rest else 1, runtime=runtime.verifier_runtime,
    )
    if show is None:
        show = runtime.verifier_split or bool(runtime.cuda_indices())
    if show:
        print(plan.describe(), file=sys.stderr)
    if not plan.fits:
        raise MemoryPlanError(plan.refusal())
    return plan


def _load_drafter(drafter: str | None, vdir: Path, ver: HFVerifier, tok, runtime: Runtime, steps: int,
                  reveal: str | None, copy_prior: str | None):
    """(the drafter adapter beside ``ver``, its identity entries): an embedded drafter by name, a
    vskip drafter directory, a Dream/DiffuCoder checkpoint, or a conditioned drafter (vskip's or
    a DFlash checkpoint), which the verifier then feeds with its hidden states."""
    identity = {}
    if drafter == EMBEDDED_CONDITIONED or (drafter not in (None, "", "default", EMBEDDED_DRAFTER)
                                           and is_conditioned(Path(drafter))):
        ddir = resolve_drafter_dir(drafter)
        verify_drafter(ddir, vdir, required=drafter == EMBEDDED_CONDITIONED)
        return _conditioned_adapter(ddir, vdir, ver, tok, runtime), {"drafter": str(drafter)}
    if drafter in (None, "", "default", EMBEDDED_DRAFTER):
        ddir = embedded_drafter_dir()
        if not (ddir / "drafter.json").exists():
            raise FileNotFoundError(f"the embedded drafter's {ddir / 'drafter.json'} is missing; reinstall vskip "
                                    f"(--drafter {UNTRAINED} drafts with an untrained one built from the verifier)")
        verify_drafter(ddir, vdir, required=True)
        model = load_drafter_model(ddir, base_dir=vdir, dtype=runtime.torch_dtype("drafter"), device=runtime.drafter_on)
        identity["drafter"] = EMBEDDED_DRAFTER
        dtok = None
    elif drafter == UNTRAINED:  # only when asked for by name
        from .drafter_io import drafter_from_verifier

        ddir = None
        from .backbone import read_hf_config

        depth = min(6, int(read_hf_config(vdir)["num_hidden_layers"]))  # the first six layers, or all it has
        model = drafter_from_verifier(vdir, num_layers=depth).to(device=runtime.drafter_on, dtype=runtime.torch_dtype("drafter"))
        identity["drafter"] = UNTRAINED
        dtok = None
    else:
        ddir = Path(drafter)
        verify_drafter(ddir, vdir)
        model = load_drafter_model(ddir, base_dir=vdir, dtype=runtime.torch_dtype("drafter"), device=runtime.drafter_on)
        identity["drafter"] = str(drafter)
        dtok = read_token_table(ddir) if is_dream_checkpoint(ddir) else None
        if dtok is None and model.spec.backbone.vocab_size != ver.vocab_size:
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
        _warn_if_fitted_elsewhere(prior, ddir)
    body = None
    if runtime.verifier_runtime == "native" and model.spec.attention == "block" and runtime.drafter_on == "cpu":
        from .native.drafter import NativeBody

        body = NativeBody.of(model, ver.max_length, runtime.threads)
    adapter = DiffusionDrafter(model, steps=steps, allowed=allowed.to(runtime.drafter_on), reveal=reveal,
                               copy=prior, banned=sorted(ver.special_ids), body=body)
    return adapter, identity


def drafter_beside(pair: ModelPair, drafter: str, models) -> object:
    """Another drafter for ``pair``'s verifier (``vskip compare``'s ``drafter=``), with the
    reveal steps, reveal order and copy prior of ``models`` (a ModelConfig)."""
    vdir = resolve_verifier_dir(models.verifier)
    if drafter not in (EMBEDDED_DRAFTER, EMBEDDED_CONDITIONED, UNTRAINED) and not Path(drafter).exists():
        raise FileNotFoundError(f"drafter path {drafter} does not exist")
    if drafter != UNTRAINED:
        check_drafter_dir(resolve_drafter_dir(drafter), vdir, steps=models.steps)
    adapter, _ = _load_drafter(drafter, vdir, pair.verifier, pair.tokenizer, pair.runtime, models.steps,
                               models.reveal, models.copy_prior)
    return adapter


def _conditioned_adapter(ddir: Path, vdir: Path, ver: HFVerifier, tok, runtime: Runtime):
    """A conditioned drafter beside ``ver``: the verifier (transformers' or the native runtime's)
    hands it the tapped hidden states; it borrows the verifier's float embedding and head."""
    from .conditioned import ConditionedDrafter, HiddenTap
    from .conditioned_io import hf_parts, load_conditioned

    if ver.model is not None:
        parts = hf_parts(ver.model)
    else:
        from .backbone import read_hf_config
        from .source import float_tensors

        names = ("model.embed_tokens.weight", "lm_head.weight")
        t = float_tensors(vdir, lambda k: k in names)
        parts = (read_hf_config(vdir), t[names[0]], t.get(names[1]))
    model = load_conditioned(ddir, *parts, dtype=runtime.torch_dtype("drafter"), device=runtime.drafter_on)
    head_ids = model.head_token_ids().cpu()
    allowed = torch.tensor([i < len(tok) and i not in ver.special_ids for i in head_ids.tolist()])
    if model.spec.mask_token_id is not None:
        allowed &= head_ids != model.spec.mask_token_id
    tap = HiddenTap(model.spec.target_layers)
    ver.set_tap(tap)
    return ConditionedDrafter(model, tap, allowed=allowed.to(runtime.drafter_on))


def load_pair(
    runtime: Runtime,
    drafter: str | None = None,
    verifier: str | None = None,
    steps: int = STEPS,
    use_cache: bool = True,
    need_drafter: bool = True,
    reveal: str | None = None,
    copy_prior: str | None = "auto",
    budget: tuple[int, int, int] | None = None,
) -> ModelPair:
    """The verifier (embedded default or a directory) and, when asked, the drafter, after a
    memory plan for ``budget`` (longest prompt, new tokens, block length) says they fit.

    ``copy_prior``: ``auto`` uses the drafter directory's ``copy_prior.json`` when it has one,
    ``off`` (or None) none, anything else is the path of a copy-prior file."""
    runtime.activate()
    if need_drafter and runtime.dtype != "float32":
        print(f"vskip: note: the verifier runs in {runtime.dtype}: its argmax can round differently in a "
              f"block verification than in a one-token step, so Strict SDD is not guaranteed "
              f"to equal ar token for token (use --dtype float32 for that)", file=sys.stderr)
    if need_drafter and drafter not in (None, "", "default", EMBEDDED_DRAFTER, EMBEDDED_CONDITIONED, UNTRAINED) \
            and not Path(drafter).exists():
        raise FileNotFoundError(f"drafter path {drafter} does not exist")
    if need_drafter and copy_prior not in (None, "off", "none", "auto") and not Path(copy_prior).exists():
        raise FileNotFoundError(f"copy prior {copy_prior} does not exist")  # before any weights load
    if need_drafter and copy_prior not in (None, "off", "none", "auto") and not Path(copy_prior).is_dir() \
            and not Path(copy_prior).is_file():
        raise ValueError(f"copy prior {copy_prior} is not a regular file")
    if need_drafter and drafter == EMBEDDED_CONDITIONED \
            and not (resolve_drafter_dir(drafter) / "drafter.json").exists():
        raise FileNotFoundError("no conditioned drafter ships with vskip: train one (vskip train-conditioned, "
                                "docs/conditioned.md) and pass its directory with --drafter")
    if need_drafter and drafter in (None, "", "default", EMBEDDED_DRAFTER, EMBEDDED_CONDITIONED) \
            and not (resolve_drafter_dir(drafter) / "drafter.json").exists():  # never a silent stand-in
        raise FileNotFoundError(f"the embedded drafter's {resolve_drafter_dir(drafter) / 'drafter.json'} is missing; reinstall "
                                f"vskip (--drafter {UNTRAINED} drafts with an untrained one built from the verifier)")
    vdir = resolve_verifier_dir(verifier)
    if need_drafter and drafter != UNTRAINED:  # before anything reads its files: they must fit the verifier
        check_drafter_dir(resolve_drafter_dir(drafter), vdir, gamma=budget[2] if budget else None, steps=steps)
    if need_drafter and is_conditioned(resolve_drafter_dir(drafter)):
        if copy_prior not in (None, "off", "none", "auto"):
            raise ValueError(f"--copy-prior {copy_prior}: the conditioned drafter {drafter} has no copy prior")
        from .backbone import read_hf_config
        from .conditioned_io import check_against_verifier, read_spec

        # before any weights load: tapped layers, width, vocabulary and the block against gamma
        check_against_verifier(read_spec(resolve_drafter_dir(drafter)), read_hf_config(vdir), resolve_drafter_dir(drafter),
                               gamma=budget[2] if budget else None)
    plan = plan_pair(runtime, vdir, resolve_drafter_dir(drafter) if need_drafter else None, use_cache, budget)
    if runtime.verifier_runtime == "native":
        ver, tok = load_native_verifier(verifier, vdir, runtime, use_cache)
    else:
        from .source import transformers_dir

        ver, tok = load_verifier(transformers_dir(verifier), runtime, use_cache, device_map=plan.verifier_map)
    identity = {"verifier": EMBEDDED_VERIFIER if verifier in (None, "", "default") else str(verifier)}
    d_adapter = None
    if need_drafter:
        d_adapter, ident = _load_drafter(drafter, vdir, ver, tok, runtime, steps, reveal, copy_prior)
        identity |= ident
    return ModelPair(d_adapter, ver, tok, identity, runtime, plan)
