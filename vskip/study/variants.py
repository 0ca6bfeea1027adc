"""Configurations of ``vskip compare`` (``--configs``): parsing an entry such as
``raw+eta_b=0.7+k_min=3+drafter=paper`` into a :class:`Variant`, a vskip policy with its decode
settings, reveal steps, verifier cache, predictor and drafter, or one of transformers' decoders.
Nothing here loads a model."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..defaults import POLICY_PARAMETERS, SHAPES, STANDALONE_DRAFTER, grows


def strict_in(shape: dict) -> str:
    """The configuration of Strict SDD in ``shape`` (:data:`vskip.defaults.SHAPES`) with the
    standalone drafter, whatever the command's drafter."""
    keys = [f"{k}={shape[k]}" for k in ("gamma", "gamma_max", "min_match", "trim") if shape.get(k) is not None
            and (k != "min_match" or shape.get("gamma_max") is not None)]
    steps = [f"steps={shape['steps']}"] if shape["steps"] != SHAPES["study"]["steps"] else []
    drafts = [f"drafts={shape['drafts']}"] if shape.get("drafts", "drafter") != "drafter" else []
    return "+".join(["strict", *keys, *steps, *drafts, f"drafter={shape['drafter'] or STANDALONE_DRAFTER}"])


#: the ``default`` configuration: Strict SDD in the default preset's shape (chosen on MBPP prompts
#: outside the evaluation sets; docs/results/speed.md), whatever the command's preset
DEFAULT = strict_in(SHAPES["default"])
#: the ``fast`` configuration: the opt-in shape the speed pages measured before the default decode
#: took a shape of its kind (trimming at 0.5 where the default trims at 0.3); kept so that their
#: commands rerun as they were
FAST = "strict+gamma=4+gamma_max=16+min_match=6+trim=0.5+drafter=" + STANDALONE_DRAFTER
#: the ``drafted`` configuration: the default shape drafting every round (``drafts=drafter``),
#: the default decode before its rounds chose their drafts (docs/results/payoff.md); kept so that
#: the commands of the pages measured with it rerun as they were
DRAFTED = strict_in({**SHAPES["default"], "drafts": "drafter"})
#: the ``paper`` configuration: Strict SDD in the paper's shape (the standalone diffusion drafter,
#: gamma 32, two reveal steps)
PAPER = strict_in(SHAPES["paper"])
#: the configurations ``--configs`` names by a word
NAMED = {"default": DEFAULT, "drafted": DRAFTED, "fast": FAST, "paper": PAPER}

#: settings a configuration may change, and how to read them
_KEYS = {"gamma": int, "gamma_max": int, "min_match": int, "trim": float, "steps": int, "drafts": str}
#: a policy's own parameters (``defaults.POLICY_PARAMETERS``), and how to read them
_POLICY_KEYS = {k: p.type for k, p in POLICY_PARAMETERS.items()}
_SWITCH = {"on": True, "off": False}
_ON_OFF = ("cache", "speculative")
#: the command's policy flags every policy configuration starts from
POLICY_FLAGS = tuple(k for k, p in POLICY_PARAMETERS.items() if p.flag)


@dataclass(frozen=True)
class Variant:
    """One configuration: a vskip policy with its decode settings and reveal steps, one of
    transformers' decoders (``hf`` greedy, ``lookup`` with ``lookup`` tokens), or llama.cpp's
    (``engine``)."""

    name: str
    policy: str | None = None
    decode: object = None
    steps: int | None = None
    lookup: int | None = None
    params: tuple = ()  # (key, value) pairs of the policy's own parameters
    cache: bool | None = None  # the verifier's KV cache; None: as the pair was loaded
    predictor: str | None = None  # this configuration's predictor directory; None: the command's
    drafter: str | None = None  # this configuration's drafter (a name or directory); None: the command's
    engine: str | None = None  # another engine's decoder (``llamacpp``, ``llamacpp-ngram-mod``: :mod:`vskip.study.llamacpp`)

    @property
    def hf(self) -> bool:
        return self.policy is None

    def policy_config(self):
        from ..engine.policy import PolicyConfig

        return PolicyConfig.make(self.policy, **dict(self.params))

    def settings(self, models, predictor: str | None = None):
        """The checked :class:`~vskip.engine.settings.Settings` of this configuration on the command's
        ``models`` (a ModelConfig) and ``--predictor`` (None for transformers' decoders)."""
        if self.hf:
            return None
        from ..engine.settings import Settings

        m = replace(models, steps=self.steps or models.steps, **({"drafter": self.drafter} if self.drafter else {}))
        return Settings(self.policy_config(), self.decode, m, predictor=self.predictor or predictor)


def _other_engine(spec: str, sampled: tuple) -> Variant | None:
    """The Variant of transformers' (``hf``, ``lookupN``) or llama.cpp's (``llamacpp[-MODE]``)
    decoders, or None for a vskip policy."""
    if spec == "hf":
        return Variant(spec, params=sampled)
    if spec.startswith("llamacpp"):
        from .llamacpp import spec_of

        spec_of(spec)
        if sampled:
            raise ValueError(f"{spec}: llama.cpp's configurations decode greedily; leave out --temperature")
        return Variant(spec, engine=spec)
    if spec.startswith("lookup"):
        n = spec[len("lookup"):]
        if not n.isdigit() or int(n) < 1:
            raise ValueError(f"bad configuration {spec!r}; expected lookupN with N >= 1")
        return Variant(spec, lookup=int(n), params=sampled)
    return None


def parse_variant(spec: str, base, steps: int, predictor: str | None = None, flags: dict | None = None):
    """The :class:`Variant` of a ``--configs`` entry; ``base`` is the command's DecodeConfig (or a
    function of a policy's name giving the DecodeConfig that policy starts from, as presets shape
    Strict SDD and the skipping methods apart),
    ``flags`` its policy flags (:data:`POLICY_FLAGS`, overridden by the entry's own) and
    ``predictor`` the ``--predictor`` directory that learned signals read."""
    from dataclasses import fields

    from ..engine.policy import POLICIES, PolicyConfig

    spec = spec.strip()
    name = spec.split("+")[0]
    if callable(base):
        base = base(name if name in POLICIES else "ar")
    if spec in NAMED:  # a whole shape, whatever the command's
        whole = replace(base, gamma_max=None, min_match=SHAPES["study"]["min_match"], trim=None, drafts="drafter")
        return replace(parse_variant(NAMED[spec], whole, steps), name=spec)
    # transformers' decoders sample with the same settings (their own random numbers)
    s = base.sampling
    sampled = () if s.greedy else (("seed", s.seed), ("temperature", s.temperature), ("top_k", s.top_k), ("top_p", s.top_p))
    other = _other_engine(spec, sampled)
    if other is not None:
        return other
    _, *pairs = spec.split("+")
    if name not in POLICIES:
        raise ValueError(f"unknown configuration {spec!r}; expected POLICY[+key=value...], hf, lookupN or llamacpp[-MODE]")
    kw, params, cache, own, drafter = {}, {}, None, None, None
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key == "predictor" and value:
            own = value
            continue
        if key == "drafter" and value:
            drafter = value
            continue
        read = _KEYS.get(key) or _POLICY_KEYS.get(key) or (_SWITCH.get if key in _ON_OFF else None)
        if read is None or not value:
            raise ValueError(f"bad setting {pair!r} in {spec!r}; expected key=value with key in "
                             f"{', '.join([*_KEYS, *_POLICY_KEYS, 'cache', 'speculative', 'predictor', 'drafter'])}")
        try:
            v = read(value)
        except ValueError:
            v = None
        if v is None:
            raise ValueError(f"bad value in {pair!r} of {spec!r}" + (" (on or off)" if key in _ON_OFF else ""))
        if key == "cache":
            cache = v
        elif key == "speculative":  # the standard rule of speculative sampling (docs/sampling.md)
            kw["sampling"] = replace(base.sampling, speculative=v)
        else:
            (kw if key in _KEYS else params)[key] = v
    if "gamma" in kw and "gamma_max" not in kw and not grows(base.gamma_max, kw["gamma"]):
        kw["gamma_max"] = None  # as a preset's block growth gives way to a longer --gamma
    s = kw.pop("steps", steps)
    if s < 1:
        raise ValueError(f"steps must be >= 1 in {spec!r}")
    if name in ("ar", "strict") and params:
        raise ValueError(f"{spec!r}: {name} has no parameters to set")
    # the parameters that differ from the policy's defaults, whichever way they were given
    ask = {k: v for k, v in (flags or {}).items() if name not in ("ar", "strict")} | params
    if ask.get("alpha") is not None and "survival" not in ask:
        ask["survival"] = "model"
    p, default = PolicyConfig.make(name, **ask), PolicyConfig.make(name)  # the policy's own checks
    changed = {f.name: getattr(p, f.name) for f in fields(p)
               if f.name not in ("name", "guards") and getattr(p, f.name) != getattr(default, f.name)}
    if own is not None and not p.learned:
        raise ValueError(f"{spec!r}: predictor= is for a learned signal, and {name} reads none")
    v = Variant(spec, policy=name, decode=replace(base, **kw), steps=s, params=tuple(sorted(changed.items())),
                cache=cache, predictor=own, drafter=drafter)
    if p.learned and not (own or predictor):
        raise ValueError(f"{spec!r} reads a trained {p.predictor_kind} predictor: give --predictor DIR")
    return v
