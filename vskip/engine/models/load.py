"""Loading a drafter/verifier pair: the embedded default, or local checkpoint directories.

Nothing here reaches a model hub (every read is ``local_files_only``) and no code from a checkpoint runs
(``trust_remote_code`` stays off; the drafter is read from safetensors into our own module).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ...defaults import GAMMA, MAX_NEW_TOKENS, STEPS
from ..runtime import Runtime, parse_max_memory
from .attention import use_gqa_attention
from .drafter_check import check_drafter_dir
from .conditioned_io import is_conditioned
from .copy import COPY_FILE, CopyPrior
from .drafter import DiffusionDrafter
from .drafter_io import is_dream_checkpoint, load_drafter_model
from .embedded import (EMBEDDED_CONDITIONED, EMBEDDED_DRAFTER, EMBEDDED_VERIFIER, embedded_drafter_dir,
                       embedded_verifier_dir, file_sha256, gguf_path)
from .placement import MemoryPlan, MemoryPlanError, plan_memory
from .verifier import HFVerifier

#: the ``--drafter`` name of an untrained drafter built from the verifier's first layers
UNTRAINED = "untrained"
#: Above this share of shared ids that decode differently, a drafter's vocabulary does not fit.
MAX_VOCAB_MISMATCH = 0.01


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


def resolve_verifier_dir(verifier: str | None) -> Path:
    if verifier in (None, "", "default", EMBEDDED_VERIFIER):
        return embedded_verifier_dir()
    p = Path(verifier)
    if not p.exists():
        raise FileNotFoundError(f"verifier path {verifier} does not exist")
    if not (p / "config.json").exists():
        raise ValueError(f"verifier path {verifier} has no config.json (a transformers checkpoint directory is expected)")
    return p


def load_verifier(path: Path, runtime: Runtime, use_cache: bool = True, device_map: dict | None = None):
    """The verifier, read from safetensors straight into its dtype and onto its device (CUDA), or
    spread over several with ``device_map`` (module -> device, as :func:`plan_pair` computes it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    where = runtime.verifier_on
    if device_map is None and where.startswith("cuda"):
        device_map = {"": where}  # straight onto the GPU: no copy of the whole model in host memory
    model = AutoModelForCausalLM.from_pretrained(path, dtype=runtime.torch_dtype(), trust_remote_code=False,
                                                 local_files_only=True, device_map=device_map)
    if device_map is None:
        model.to(where)
    if all(p.device.type == "cpu" for p in model.parameters()):
        use_gqa_attention(model)
    eos, special = _stop_and_special(tok, model.generation_config)
    return HFVerifier(model, eos, special, use_cache=use_cache), tok


def _stop_and_special(tok, generation_config) -> tuple[list[int], list[int]]:
    """The ids that end a sequence (the tokenizer's and the generation config's eos) and the
    special ids no skip may commit."""
    eos = set()
    for src in (tok.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        if src is None:
            continue
        eos |= set(src) if isinstance(src, (list, tuple)) else {src}
    special = set(tok.all_special_ids) | {i for i, t in tok.added_tokens_decoder.items() if t.special}
    return sorted(eos), sorted(special)


def native_reason(verifier: str | None, drafter: str | None = None) -> str | None:
    """Why the native runtime cannot compute this verifier (beside this drafter), or None when it
    can; whether it builds on this machine is :func:`~vskip.engine.models.native.build.unsupported_reason`'s."""
    if verifier not in (None, "", "default", EMBEDDED_VERIFIER):
        from .backbone import read_hf_config
        from .native.model import shape_of_hf

        try:
            from types import SimpleNamespace

            shape_of_hf(SimpleNamespace(**read_hf_config(Path(verifier)))).check()
        except (ValueError, FileNotFoundError, KeyError, TypeError, AttributeError) as e:
            return f"the native runtime cannot run the verifier {verifier}: {e}"
    if drafter not in (None, "", "default", EMBEDDED_DRAFTER, UNTRAINED):
        if Path(drafter).exists() and is_conditioned(Path(drafter)):
            return "a conditioned drafter reads the verifier's hidden states, which only the transformers runtime hands over"
    if drafter == EMBEDDED_CONDITIONED:
        return "a conditioned drafter reads the verifier's hidden states, which only the transformers runtime hands over"
    return None


def load_native_verifier(verifier: str | None, path: Path, runtime: Runtime, use_cache: bool = True):
    """The verifier on the native runtime: the embedded one from its GGUF blocks as they ship, a
    checkpoint directory's float weights as Q8_0 blocks; the tokenizer from ``path``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from .native.gguf_io import load_gguf
    from .native.model import from_hf_model
    from .native.verifier import NativeVerifier

    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        gen = None
    if verifier in (None, "", "default", EMBEDDED_VERIFIER):
        net = load_gguf(gguf_path(), runtime.threads)
    else:
        import torch

        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=False,
                                                     local_files_only=True)
        net = from_hf_model(model, runtime.threads)
        del model
    eos, special = _stop_and_special(tok, gen)
    return NativeVerifier(net, eos, special, use_cache=use_cache), tok


def check_prompt_fits(verifier: str | None, prompt: str | list[tuple[str, str]], max_new_tokens: int) -> int:
    """Tokenize the prompt (or the ``(name, prompt)`` pairs of a task) with the verifier's
    tokenizer alone and refuse, before any model loads, when one of them and ``max_new_tokens``
    exceed the verifier's context. Returns the longest prompt's length."""
    from transformers import AutoTokenizer

    from ..prompting import encode_chat

    vdir = resolve_verifier_dir(verifier)
    tok = AutoTokenizer.from_pretrained(vdir, trust_remote_code=False, local_files_only=True)
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


class TokenTable:
    """Token id -> token string of a tokenizer directory, read from its data files alone
    (``tokenizer.json``, or ``vocab.json`` with ``tokenizer_config.json``'s and
    ``added_tokens.json``'s added tokens): DiffuCoder ships a slow tokenizer whose class is remote
    code, and :func:`vocabulary_fit` needs only this table."""

    def __init__(self, table: dict[int, str]):
        self.table = table
        self.size = max(table) + 1 if table else 0

    def __len__(self) -> int:
        return self.size

    def convert_ids_to_tokens(self, ids):
        return [self.table.get(int(i)) for i in ids]


def read_token_table(d: Path) -> TokenTable | None:
    """The :class:`TokenTable` of tokenizer files in ``d``, or None when it holds none."""
    d = Path(d)
    table: dict[int, str] = {}
    try:
        if (d / "tokenizer.json").exists():
            t = json.loads((d / "tokenizer.json").read_text())
            vocab = t["model"]["vocab"]
            if isinstance(vocab, dict):
                table = {int(i): s for s, i in vocab.items()}
            else:  # unigram: [piece, score] in id order
                table = {i: piece[0] for i, piece in enumerate(vocab)}
            table |= {int(a["id"]): a["content"] for a in t.get("added_tokens", [])}
        elif (d / "vocab.json").exists():
            table = {int(i): s for s, i in json.loads((d / "vocab.json").read_text()).items()}
        else:
            return None
        if (d / "tokenizer_config.json").exists():
            cfg = json.loads((d / "tokenizer_config.json").read_text())
            table |= {int(i): a["content"] for i, a in (cfg.get("added_tokens_decoder") or {}).items()}
        if (d / "added_tokens.json").exists():
            table |= {int(i): s for s, i in json.loads((d / "added_tokens.json").read_text()).items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"the tokenizer files in {d} cannot be read: {e}") from None
    return TokenTable(table)


def verify_drafter(ddir: Path, vdir: Path, required: bool = False) -> None:
    """Check a drafter directory's files against its ``manifest.json`` before loading them: the
    weights' and the copy prior's sha256 must match (a damaged file refuses with one line saying
    how to rebuild it). ``required``: the manifest itself must be there and whole (the embedded
    drafter ships one). Warns when the drafter was distilled from another verifier file."""
    from ...files import FileError, read_json
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
            if required:  # a shipped drafter without the prior its manifest names: never silently
                raise FileNotFoundError(f"{f} is missing; {rebuild}")
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
        if not path.is_file():  # a FIFO would block the read
            raise ValueError(f"copy prior {path} is not a regular file")
    try:
        data = json.loads(path.read_text())
        prior = CopyPrior.from_json(data)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a copy prior: {e}") from None
    return replace(prior, meta=prior.meta | {"sha256": file_sha256(path)})


def _warn_if_fitted_elsewhere(prior: CopyPrior, ddir: Path) -> None:
    """A copy prior is fitted to one network's probabilities: warn when the one it records is not
    the drafter it is about to mix with (its weights' sha256 against the manifest's, else the file's)."""
    fitted = prior.meta.get("drafter_weights_sha256")
    if not isinstance(fitted, dict) or not fitted:
        return
    from .embedded import file_sha256

    try:
        m = json.loads((Path(ddir) / "manifest.json").read_text())
        have = {m["weights"]["file"]: m["weights"]["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        have = {name: file_sha256(Path(ddir) / name) for name in fitted if (Path(ddir) / name).exists()}
    if any(have.get(name) != sha for name, sha in fitted.items()):
        print(f"vskip: warning: the copy prior was fitted to other drafter weights than those in {ddir}; "
              "refit it (vskip fit-copy-prior) or pass --copy-prior off", file=sys.stderr)


#: the sequence a memory plan assumes when the caller knows no prompt: prompt, new tokens, block
DEFAULT_BUDGET = (1024, MAX_NEW_TOKENS, GAMMA)


def resolve_drafter_dir(drafter: str | None) -> Path:
    if drafter == EMBEDDED_CONDITIONED:
        return embedded_drafter_dir(EMBEDDED_CONDITIONED)
    return embedded_drafter_dir() if drafter in (None, "", "default", EMBEDDED_DRAFTER) else Path(drafter)


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
        batch=rest[0] if rest else 1,
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
        return _conditioned_adapter(ddir, ver, tok, runtime), {"drafter": str(drafter)}
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
        model = drafter_from_verifier(vdir).to(device=runtime.drafter_on, dtype=runtime.torch_dtype("drafter"))
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


def _conditioned_adapter(ddir: Path, ver: HFVerifier, tok, runtime: Runtime):
    """A conditioned drafter beside ``ver``: the verifier hands it the tapped hidden states."""
    from .conditioned import ConditionedDrafter, HiddenTap
    from .conditioned_io import load_conditioned

    model = load_conditioned(ddir, ver.model, dtype=runtime.torch_dtype("drafter"), device=runtime.drafter_on)
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
        ver, tok = load_verifier(vdir, runtime, use_cache, device_map=plan.verifier_map)
    identity = {"verifier": EMBEDDED_VERIFIER if verifier in (None, "", "default") else str(verifier)}
    d_adapter = None
    if need_drafter:
        d_adapter, ident = _load_drafter(drafter, vdir, ver, tok, runtime, steps, reveal, copy_prior)
        identity |= ident
    return ModelPair(d_adapter, ver, tok, identity, runtime, plan)
