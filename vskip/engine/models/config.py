"""Which models to load, where, and how: the one configuration every command that decodes
passes to :func:`vskip.engine.door.open_models` (no torch is imported here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ...defaults import STEPS


@dataclass(frozen=True)
class ModelConfig:
    """``device``: where both models run unless ``drafter_device``/``verifier_device`` say
    otherwise; ``verifier_device`` may also be a strategy spreading the verifier over several
    devices (``auto``, ``balanced``, ``balanced_low_0``, ``sequential``); ``max_memory``
    (``0=40GiB,1=40GiB``) bounds what each device may hold, and names the devices a spread
    verifier uses. ``runtime``: what computes the verifier, ``native`` (vskip's own kernels,
    :mod:`vskip.engine.models.native`), ``transformers`` (float32 on a CPU, the reference of the
    committed studies) or ``auto`` (native where it runs, :func:`vskip.engine.door.runtime_of`)."""

    drafter: str | None = None
    verifier: str | None = None
    steps: int = STEPS
    reveal: str | None = None
    verifier_cache: bool = True
    device: str | None = None
    dtype: str | None = None
    threads: int | None = None
    copy_prior: str | None = "auto"
    drafter_dtype: str | None = "auto"
    drafter_device: str | None = None
    verifier_device: str | None = None
    max_memory: str | None = None
    runtime: str = "auto"

    def __post_init__(self):
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"unknown runtime {self.runtime!r}; expected one of {', '.join(RUNTIMES)}")


#: what may compute the verifier (``auto``: native where it runs, else transformers)
RUNTIMES = ("auto", "native", "transformers")


#: fields added after run directories were first written; an old record lacks them
PLACEMENT_FIELDS = ("drafter_device", "verifier_device", "max_memory")


def with_defaults(record: dict, defaults: dict) -> dict:
    """``record`` (a stored configuration) with the keys it predates filled from ``defaults``, so
    that a run written before a field existed still resumes."""
    return {**{k: v for k, v in defaults.items() if k not in record}, **record}


def model_defaults() -> dict:
    """Defaults for a stored model configuration that lacks a field; one written before the
    runtime could be chosen was decoded with transformers."""
    return asdict(ModelConfig()) | {"runtime": "transformers"}

