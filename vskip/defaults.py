"""Defaults every command shares, defined once.

``GAMMA`` and ``STEPS`` are the study shape's (every sweep, trace and predictor is made in it); a
decoding command starts from a preset (:data:`PRESETS`): by default Strict SDD in the fastest
lossless shape measured (:data:`SHAPES`). The drafter runs in bfloat16 where the device has it
natively (:func:`vskip.engine.runtime.resolve_runtime`). The paper's main setting is gamma 32 with
two reveal steps (§5.1): ``--preset paper``.
"""

from dataclasses import dataclass

#: draft block length of the study shape
GAMMA = 8
#: The paper's gates (eta_b, eta_c) for raw confidence (§5.1, A.3, A.6)
PAPER_GATES = (0.90, 0.93)
#: reveal (denoising) steps per draft block of the study shape
STEPS = 1
#: the paper's minimum skip length and staleness threshold (§5.1)
K_MIN = 6
S_MAX = 64
#: the longest draft block accepted (the paper uses 32); longer blocks only cost memory and time
MAX_GAMMA = 512
#: the largest seed a flag takes (numpy's seed sequences take any non-negative integer)
MAX_SEED = 2**32 - 1
#: the output budget of every decode unless --max-new-tokens says otherwise (the paper's 512)
MAX_NEW_TOKENS = 512
#: the decoding methods (``--policy``); defined here so that the command line needs no numpy
POLICIES = ("ar", "strict", "lenience", "topk", "periodic", "raw", "marginal", "conditional", "prefix")
#: where a lossless round's draft comes from (``--drafts``): ``drafter``, every round (the paper's), or
#: ``payoff``, each round the copy hint alone, the drafter or the verifier alone, whichever the
#: measured costs say commits the most tokens per second (:mod:`vskip.engine.policy.payoff`)
DRAFTS = ("drafter", "payoff")
#: the decoding shapes a preset picks from: the drafter (None: the embedded standalone drafter),
#: the block length, block growth on a copy match (``gamma_max`` when the hint matches ``min_match``
#: tokens), trimming (verify only the drafted prefix of raw confidence >= ``trim``), the reveal steps and
#: where a Strict SDD round's draft comes from (``drafts``, :data:`DRAFTS`).
#: ``study``: every committed study's (its predictors and gates were trained and tuned on it);
#: ``default``: the fastest lossless Strict SDD measured on the embedded pair, chosen on MBPP prompts
#: outside the evaluation sets (docs/results/speed.md); ``paper``: the paper's (§5.1)
#: the name of the shipped standalone diffusion drafter
STANDALONE_DRAFTER = "smollm2-135m-diffusion"
SHAPES = {
    "study": {"drafter": None, "gamma": GAMMA, "gamma_max": None, "min_match": 8, "trim": None, "steps": STEPS,
              "drafts": "drafter"},
    "default": {"drafter": None, "gamma": 4, "gamma_max": 16, "min_match": 6, "trim": 0.3, "steps": STEPS,
                "drafts": "payoff"},
    "paper": {"drafter": STANDALONE_DRAFTER, "gamma": 32, "gamma_max": None, "min_match": 8, "trim": None,
              "steps": 2, "drafts": "drafter"},
}


@dataclass(frozen=True)
class Preset:
    """What a command decodes with where its flags say nothing (``--preset``): the method
    (``policy``), the shape Strict SDD and ``ar`` decode in (``lossless``) and the shape of every
    method that skips or accepts more than the verifier's token (``other``). A skipping method keeps
    the shape its gates and predictors were tuned and trained in, traces are collected in it, and so
    does a drafter the lossless shape was not measured with."""

    policy: str
    lossless: str
    other: str
    help: str

    def shape(self, policy: str, trace: bool = False, drafter: str | None = None) -> dict:
        """The shape ``policy`` decodes in (``trace``: a run that keeps the A.7 inputs of whole blocks;
        ``drafter``: the one the command names, None for the preset's)."""
        lossless = SHAPES[self.lossless]
        measured = drafter is None or drafter == (lossless["drafter"] or STANDALONE_DRAFTER)
        return lossless if policy in ("ar", "strict") and not trace and measured else SHAPES[self.other]


def grows(gamma_max: int | None, gamma: int | None) -> bool:
    """Whether a shape's block growth to ``gamma_max`` stays on under a block length ``gamma``
    (None: the shape's own): growth gives way to a base block at least as long."""
    return gamma_max is not None and (gamma is None or gamma < gamma_max)


#: named starting points of the decoding commands (``--preset``); explicit flags override them
PRESETS = {
    "default": Preset("strict", "default", "study",
                      "Strict SDD, lossless, in the fastest shape measured (gamma 4, blocks of 16 after a copy match "
                      "of 6, trimming at 0.3, each round's draft from the copy hint, the drafter or none, whichever "
                      "pays); a skipping method in the study shape"),
    "study": Preset("raw", "study", "study",
                    "every committed study's defaults: raw confidence, gamma 8, one reveal step"),
    "paper": Preset("raw", "paper", "paper",
                    "the paper's: raw confidence, the standalone diffusion drafter, gamma 32, two reveal steps"),
}


# --------------------------------------------------------------------------- policy parameters

@dataclass(frozen=True)
class Param:
    """One parameter of the decoding methods, declared once: how to read it, its default, the
    methods it belongs to, and its flag. ``field``: a field of :class:`vskip.engine.policy.PolicyConfig`
    (False: a parameterisation its ``make`` resolves into fields); ``flag``: a command-line flag
    (``--name-with-dashes``) with the default ``flag_default`` (``...``: the parameter's default)."""

    type: type
    default: object
    methods: tuple[str, ...]
    help: str
    field: bool = True
    flag: bool = True
    flag_default: object = ...


_SIGNALS = ("raw", "marginal", "conditional")
#: every policy parameter, in the order each method's summary lists its own (``policy_params``);
#: the policy's dataclass, its summaries, ``compare --configs`` keys, the report's columns and the
#: command-line flags all read this table
POLICY_PARAMETERS = {
    "eta_b": Param(float, PAPER_GATES[0], _SIGNALS, "local gate threshold (Eq. 3; default: the signal's, 0.90)",
                   flag_default=None),
    "eta_c": Param(float, PAPER_GATES[1], _SIGNALS, "prefix gate threshold (Eq. 3; default: the signal's, 0.93 for raw)",
                   flag_default=None),
    "eta_m": Param(float, None, ("marginal",), "marginal survival: both gates", field=False),
    "epsilon": Param(float, None, ("conditional",), "conditional survival: eta_c = 1 - epsilon", field=False),
    "k_min": Param(int, K_MIN, _SIGNALS, f"minimum skip length (default: {K_MIN})"),
    "period": Param(int, 4, ("periodic",), "periodic baseline: skip every P rounds (default: 4)"),
    "period_k": Param(int, 6, ("periodic",), "periodic baseline: skip length (default: 6)"),
    "lam": Param(float, 0.9, ("prefix",), "prefix policy (beyond the paper): the survival a skipped prefix must keep "
                                          "(default: 0.9)"),
    "cost_ratio": Param(float, None, ("prefix",), "prefix policy: c_D / c_V to weigh skips with (default: the costs "
                                                  "measured in the run)"),
    "s_max": Param(int, S_MAX, _SIGNALS + ("periodic", "prefix"), f"staleness threshold (default: {S_MAX})"),
    "survival": Param(str, "confidence", ("prefix",), "where the prefix policy's survival comes from", flag=False),
    "alpha": Param(float, None, ("prefix",), "prefix policy with a prefix model (--predictor): the share of committed "
                                             "tokens allowed to differ from Strict SDD; each prompt takes the threshold "
                                             "its fold calibrated (overrides --lam)"),
    "lenience": Param(float, 1.0, ("lenience",), "lenience l of Eq. 9 (default: 1)"),
    "top_k": Param(int, 1, ("topk",), "top-k acceptance k (default: 1)"),
}
