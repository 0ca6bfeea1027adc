"""The one door to a decode.

Every command that decodes (``generate``, ``run``, ``compare``, ``sweep``) enters here with a
:class:`~vskip.engine.settings.Settings`, checked when it was built. :func:`open_decoder` then does
the rest once, in this order: it resolves the runtime (:func:`runtime_of`), tokenizes the prompts
with the verifier's tokenizer alone so that one too long for the context refuses before any model
loads, plans the memory for the longest block the decode will draft, loads the pair
(:func:`open_models`), and has the predictor a learned policy reads loaded by the loader the
caller hands over (the studies', :func:`vskip.study.predictor.policy_predictor`, which checks it
against the settings its online thresholds were chosen with). The :class:`Decoder` it returns
decodes prompts with exactly those settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Sequence

from .models.config import ModelConfig
from .settings import Settings


def runtime_of(models: ModelConfig):
    """The runtime (devices, dtypes, threads, memory, what computes the verifier) ``models`` asks
    for: the one place it is resolved. ``auto`` takes the native runtime where the verifier runs
    on a CPU that has it, no ``--dtype`` was asked for, and the pair fits it (a Llama or Qwen2
    verifier, no drafter reading its hidden states); else transformers."""
    from .runtime import resolve_runtime

    base = resolve_runtime(models.device, models.dtype, models.threads, models.drafter_dtype, models.drafter_device,
                           models.verifier_device, models.max_memory)
    choice = models.runtime
    if choice == "transformers" or (choice == "auto" and (base.verifier_on != "cpu" or models.dtype is not None)):
        return base
    from dataclasses import replace

    from .models.verifiers import native_reason
    from .models.native.build import NativeUnavailable, chosen_isa, unsupported_reason

    try:
        chosen_isa()
    except NativeUnavailable as e:  # a variant asked for by name that this CPU cannot run: never swapped
        raise ValueError(f"--runtime {choice}: {e}") from None
    build = unsupported_reason()  # no compiler, or one that cannot build the kernels
    reason = build or native_reason(models.verifier, models.drafter)
    if reason is None:
        return replace(base, verifier_runtime="native")
    if choice == "native":
        raise ValueError(f"--runtime native: {reason}")
    if build:
        _say_once(f"vskip: the native runtime is not used: {reason}; the verifier runs on float32 transformers")
    return base


@lru_cache(maxsize=None)
def _say_once(line: str) -> None:
    import sys

    print(line, file=sys.stderr)


def open_models(models: ModelConfig, need_drafter: bool = True, budget: tuple | None = None, runtime=None):
    """The model pair, placed for ``budget`` (longest prompt, new tokens, longest block and
    optionally the batch size; None: a generic budget, as a sweep's workers load once per process)."""
    from .models.load import load_pair

    runtime = runtime or runtime_of(models)
    return load_pair(runtime, drafter=models.drafter, verifier=models.verifier, steps=models.steps,
                     use_cache=models.verifier_cache, need_drafter=need_drafter, reveal=models.reveal,
                     copy_prior=models.copy_prior, budget=budget)


def longest_prompt(models: ModelConfig, prompts: str | list[tuple[str, str]], max_new_tokens: int) -> int:
    """The longest of ``prompts`` (a user message, or ``(name, text)`` pairs) in the verifier's
    tokens, from its tokenizer alone: a prompt that cannot fit ``max_new_tokens`` more refuses
    here, before any model loads."""
    from .models.verifiers import check_prompt_fits

    return check_prompt_fits(models.verifier, prompts, max_new_tokens)


def settings_record(s: Settings) -> dict:
    """The settings as a run directory's ``config.json`` records them (``run``'s policy, decode
    and models), which the online thresholds' settings are compared with."""
    policy = asdict(s.policy)
    policy["guards"] = asdict(s.policy.guards)
    return json.loads(json.dumps({"policy": policy, "decode": asdict(s.decode), "models": asdict(s.models)}))


@dataclass
class Decoder:
    """A decode opened through the door: the settings, the loaded pair and the predictor."""

    settings: Settings
    pair: object
    runtime: object
    predictor: object | None = None
    #: the chooser of payoff rounds' drafts, kept across prompts: what one measured serves the next
    chooser: object = None

    def _chooser(self, any_request: bool = False):
        """The chooser, made for this verifier's tokenizer when the settings draft by payoff
        (``any_request``: or a request may ask for it, as a server's may)."""
        if self.chooser is None and (any_request or self.settings.decode.drafts == "payoff"):
            from .chooser import chooser_for

            self.chooser = chooser_for(self.pair.tokenizer)
        return self.chooser

    @property
    def drafter(self):
        return self.pair.drafter if self.settings.policy.uses_drafter else None

    def warmup(self, ids: Sequence[int]) -> None:
        """A.8: one draft block (the longest this decode drafts) and one verifier forward."""
        from .decode import warmup

        warmup(self.drafter, self.pair.verifier, ids, self.settings.longest_block)

    def decode(self, ids: Sequence[int], task_id: str | None = None, sample: int = 0):
        from .decode import decode

        s = self.settings
        return decode(ids, self.drafter, self.pair.verifier, s.policy, s.decode, self.predictor, task_id=task_id,
                      sample=sample, chooser=self._chooser())

    def loop(self, batch_size: int = 1, prefill_chunk: int | None = None, draft_max_batch: int | None = None,
             prefill_depth: int | None = None):
        """The decode loop itself (:class:`~vskip.engine.decode.Loop`), for a caller that admits
        jobs as they come and reads each round (the server); jobs may bring their own settings."""
        from .decode import Loop

        s = self.settings
        return Loop(self.pair.drafter, self.pair.verifier, s.policy, s.decode, self.predictor, batch_size,
                    prefill_chunk=prefill_chunk, draft_max_batch=draft_max_batch, prefill_depth=prefill_depth,
                    chooser=self._chooser(any_request=True))

    def decode_many(self, jobs, batch_size: int = 1):
        """Decode :class:`~vskip.engine.decode.Job` s ``batch_size`` at a time, yielding (job, result)
        as each finishes."""
        from .decode import decode_many

        s = self.settings
        return decode_many(jobs, self.drafter, self.pair.verifier, s.policy, s.decode, self.predictor, batch_size,
                           chooser=self._chooser())


def open_decoder(s: Settings, prompts: str | list[tuple[str, str]] | None = None, pair=None,
                 record: dict | None = None, batch_size: int = 1, drafter: bool | None = None,
                 predictors=None) -> Decoder:
    """Open a decode of ``s``: the runtime once, the prompts' fit (before any model loads), the pair
    placed for the longest block the decode drafts and ``batch_size`` sequences side by side
    (unless ``pair`` is one already loaded), and the predictor (``record``: the run's recorded
    settings, for the online thresholds' check; ``drafter``: load the drafter or not, whatever the
    policy reads, for a server whose requests choose their own policy; ``predictors``: what loads
    the trained predictor a learned policy reads, :func:`vskip.study.predictor.policy_predictor`,
    which the commands that decode learned policies pass)."""
    runtime = pair.runtime if pair is not None and pair.runtime is not None else runtime_of(s.models)
    if pair is None:
        budget = None
        if prompts is not None:
            n = longest_prompt(s.models, prompts, s.decode.max_new_tokens)
            budget = (n, s.decode.max_new_tokens, s.longest_block, batch_size)
        need = s.policy.uses_drafter if drafter is None else drafter
        pair = open_models(s.models, need, budget, runtime)
    predictor = None
    if s.policy.learned:
        if predictors is None:
            raise ValueError(f"--policy {s.policy.name} reads a trained predictor, which this command does not load")
        predictor = predictors(s, runtime, record)
    return Decoder(s, pair, runtime, predictor)
