"""The verifier, loaded for the runtime that computes it: its directory (config and tokenizer), the
transformers verifier, the native one, what the native runtime cannot run, and the prompts' fit
to its context, checked from the tokenizer alone before any weight loads. Nothing here reaches a
model hub (every read is ``local_files_only``) and no code from a checkpoint runs."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

from ..runtime import Runtime
from .attention import use_gqa_attention
from .embedded import EMBEDDED_VERIFIER
from .verifier import HFVerifier

#: the ``--drafter`` name of an untrained drafter built from the verifier's first layers
UNTRAINED = "untrained"


def resolve_verifier_dir(verifier: str | None) -> Path:
    """The directory of ``verifier``'s config and tokenizer (:func:`.source.verifier_dir`)."""
    from .source import verifier_dir

    return verifier_dir(verifier)


def load_verifier(path: Path, runtime: Runtime, use_cache: bool = True, device_map: dict | None = None):
    """The verifier, read from safetensors straight into its dtype and onto its device (CUDA), or
    spread over several with ``device_map`` (module -> device, as :func:`plan_pair` computes it)."""
    from transformers import AutoModelForCausalLM

    tok = verifier_tokenizer(path)
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


@lru_cache(maxsize=8)
def _tokenizer(path: str, stamp: tuple):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=False, local_files_only=True)


def verifier_tokenizer(path: Path):
    """The tokenizer of verifier directory ``path``, read once a process (the prompts' fit and the
    loaded pair share it; a directory whose tokenizer files change is read again)."""
    files = sorted(p for p in Path(path).glob("tokenizer*") if p.is_file())
    return _tokenizer(str(Path(path).resolve()), tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in files))


def native_reason(verifier: str | None, drafter: str | None = None) -> str | None:
    """Why the native runtime cannot compute this verifier, or None when it can (beside any
    drafter: a conditioned one reads the native forward's tapped states); whether it builds on
    this machine is :func:`~vskip.engine.models.native.build.unsupported_reason`'s."""
    if verifier not in (None, "", "default", EMBEDDED_VERIFIER):
        from .backbone import read_hf_config
        from .native.shape import shape_of_config

        vdir = resolve_verifier_dir(verifier)  # a GGUF file is read and checked whole here: damaged, it refuses
        try:
            shape_of_config(read_hf_config(vdir)).check()
        except (ValueError, FileNotFoundError, KeyError, TypeError, AttributeError) as e:
            return f"the native runtime cannot run the verifier {verifier}: {e}"
    return None


def load_native_verifier(verifier: str | None, path: Path, runtime: Runtime, use_cache: bool = True):
    """The verifier on the native runtime (:func:`.source.native_net`: a GGUF file's blocks as they
    are, a checkpoint directory's float weights as Q8_0 blocks); the tokenizer from ``path``."""
    from transformers import GenerationConfig

    from .native.verifier import NativeVerifier
    from .source import native_net

    tok = verifier_tokenizer(path)
    try:
        gen = GenerationConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        gen = None
    net = native_net(path, runtime.threads)
    eos, special = _stop_and_special(tok, gen)
    return NativeVerifier(net, eos, special, use_cache=use_cache), tok


def check_prompt_fits(verifier: str | None, prompt: str | list[tuple[str, str]], max_new_tokens: int) -> int:
    """Tokenize the prompt (or the ``(name, prompt)`` pairs of a task) with the verifier's
    tokenizer alone and refuse, before any model loads, when one of them and ``max_new_tokens``
    exceed the verifier's context. Returns the longest prompt's length."""
    from ..prompting import encode_chat

    vdir = resolve_verifier_dir(verifier)
    tok = verifier_tokenizer(vdir)
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
