"""Defaults every command shares, defined once.

``GAMMA`` and ``STEPS`` are the fastest lossless Strict SDD configuration of the embedded pair on
a CPU (docs/results/speed.md); the drafter runs in bfloat16 where the device has it natively
(:func:`vskip.engine.runtime.resolve_runtime`). The paper's main setting is gamma 32 with two reveal
steps (§5.1): pass ``--gamma 32 --steps 2`` for it.
"""

from dataclasses import dataclass

#: draft block length
GAMMA = 8
#: The paper's gates (eta_b, eta_c) for raw confidence (§5.1, A.3, A.6)
PAPER_GATES = (0.90, 0.93)
#: reveal (denoising) steps per draft block
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
#: named decoding shapes (``--preset``): the drafter (None: the embedded standalone drafter), the
#: block length and the reveal steps a command starts from; explicit flags override them
PRESETS = {
    "default": {"drafter": None, "gamma": GAMMA, "steps": STEPS},
    "paper": {"drafter": "smollm2-135m-diffusion", "gamma": 32, "steps": 2},
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
