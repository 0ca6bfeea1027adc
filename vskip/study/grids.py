"""The named grids of ``vskip sweep``: the paper's (A.6 Table 5, the ``k_min`` diagnostic of
Figure 5, the gate ablation of Table 2, the periodic baseline of Table 3, the transfer grid) and
small ones for a CPU. A grid is a list of named :class:`PolicyConfig` points."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..defaults import K_MIN, S_MAX
from ..engine.policy import PolicyConfig

# --------------------------------------------------------------------------- grids

#: A.6 Table 5.
LENIENCE = (1.0, 0.99, 0.975, 0.95, 0.90, 0.80, 0.70, 0.50, 0.30)
TOP_K = (2, 3, 5)
RAW_ETA_B = (0.90, 0.95)
RAW_ETA_C = (0.995, 0.99, 0.98, 0.97, 0.95, 0.93, 0.90)
RAW_EXTRA = ((0.80, 0.93), (0.80, 0.85), (0.70, 0.70), (0.60, 0.50))
MARGINAL_ETA_M = (0.85, 0.90, 0.93, 0.95, 0.97, 0.98, 0.99)
CONDITIONAL_ETA_C = (0.99, 0.98, 0.97, 0.95, 0.93, 0.90, 0.85, 0.80)
#: Figure 5 and Table 3.
KMIN = (0, 3, 6, 9, 12, 16, 24, 32)
PERIODS = (3, 4, 8)


@dataclass(frozen=True)
class GridPoint:
    """One configuration of a grid: its run directory ``name``, the policy, and its ``role`` in
    the paper (``frontier``, ``reference``, ``kmin``, ``gate:local-only``, ...)."""

    name: str
    policy: PolicyConfig
    role: str


def _eta(x: float) -> str:
    """0.9 -> "0.90", 0.995 -> "0.995", 0 -> "0.00"."""
    s = f"{x:.4f}".rstrip("0")
    whole, _, frac = s.partition(".")
    return f"{whole}.{frac.ljust(2, '0')}"


def config_name(p: PolicyConfig) -> str:
    """The run directory name of a configuration; only the parameters that matter appear."""
    if p.name in ("ar", "strict"):
        return p.name
    if p.name == "lenience":
        return f"lenience_l{_eta(p.lenience)}"
    if p.name == "topk":
        return f"topk_k{p.top_k}"
    if p.name == "periodic":
        return f"periodic_P{p.period}_K{p.period_k}_s{p.s_max}"
    if p.name == "prefix":
        cost = "measured" if p.cost_ratio is None else f"r{p.cost_ratio:g}"
        gate = f"a{p.alpha:g}" if p.alpha is not None else f"lam{_eta(p.lam)}"
        model = "_model" if p.survival == "model" else ""
        return f"prefix{model}_{gate}_{cost}_s{p.s_max}"
    if p.name == "marginal" and p.eta_b == p.eta_c:
        gates = f"em{_eta(p.eta_b)}"
    else:
        gates = f"eb{_eta(p.eta_b)}_ec{_eta(p.eta_c)}"
    return f"{p.name}_{gates}_k{p.k_min}_s{p.s_max}"


def _point(name: str, role: str, **kw) -> GridPoint:
    p = PolicyConfig.make(name, **kw)
    return GridPoint(config_name(p), p, role)


def _table5(k_min: int, s_max: int) -> list[GridPoint]:
    sig = {"k_min": k_min, "s_max": s_max}
    pts = [_point("strict", "reference")]
    pts += [_point("lenience", "frontier", lenience=l) for l in LENIENCE]
    pts += [_point("topk", "frontier", top_k=k) for k in TOP_K]
    pairs = [(b, c) for b in RAW_ETA_B for c in RAW_ETA_C] + list(RAW_EXTRA)
    pts += [_point("raw", "frontier", eta_b=b, eta_c=c, **sig) for b, c in pairs]
    pts += [_point("marginal", "frontier", eta_m=m, **sig) for m in MARGINAL_ETA_M]
    pts += [_point("conditional", "frontier", eta_b=0.90, eta_c=c, **sig) for c in CONDITIONAL_ETA_C]
    return pts


def _kmin(k_mins: Sequence[int], eta_b: float, eta_c: float, s_max: int) -> list[GridPoint]:
    pts = [_point("strict", "reference")]
    pts += [_point("raw", "kmin", eta_b=eta_b, eta_c=eta_c, k_min=k, s_max=s_max) for k in k_mins]
    return pts


def _gates(k_min: int, s_max: int) -> list[GridPoint]:
    """Table 2: each variant removes one gate by setting its threshold to 0."""
    sig = {"k_min": k_min, "s_max": s_max}
    return [
        _point("strict", "reference"),
        _point("raw", "gate:full", eta_b=0.90, eta_c=0.93, **sig),
        _point("raw", "gate:local-only", eta_b=0.90, eta_c=0.0, **sig),
        _point("raw", "gate:geometric-only", eta_b=0.0, eta_c=0.93, **sig),
        _point("conditional", "gate:full", eta_b=0.90, eta_c=0.90, **sig),
        _point("conditional", "gate:product-only", eta_b=0.0, eta_c=0.90, **sig),
        _point("conditional", "gate:local-only", eta_b=0.90, eta_c=0.0, **sig),
    ]


def _periodic(s_max: int) -> list[GridPoint]:
    return [_point("strict", "reference")] + [
        _point("periodic", "periodic", period=P, period_k=6, s_max=s_max) for P in PERIODS
    ]


def _transfer(k_min: int, s_max: int) -> list[GridPoint]:
    """Table 4's rows: Strict SDD and each signal at the paper's fixed setting."""
    sig = {"k_min": k_min, "s_max": s_max}
    return [
        _point("strict", "reference"),
        _point("raw", "transfer", eta_b=0.90, eta_c=0.93, **sig),
        _point("marginal", "transfer", eta_m=0.90, **sig),
        _point("conditional", "transfer", eta_b=0.90, eta_c=0.90, **sig),
    ]


def _cpu_signals(s_max: int) -> list[GridPoint]:
    """The online frontier of the three signals on a CPU: each at three settings from loose to
    tight, at k_min 3 (a small drafter rarely has 6 tokens to skip)."""
    sig = {"k_min": 3, "s_max": s_max}
    pts = [_point("strict", "reference")]
    pts += [_point("raw", "frontier", eta_b=b, eta_c=c, **sig) for b, c in ((0.80, 0.85), (0.70, 0.70), (0.60, 0.50))]
    pts += [_point("marginal", "frontier", eta_m=m, **sig) for m in (0.90, 0.70, 0.50)]
    pts += [_point("conditional", "frontier", eta_b=0.70, eta_c=c, **sig) for c in (0.90, 0.70, 0.50)]
    return pts


def _cpu_small(k_min: int, s_max: int) -> list[GridPoint]:
    """A grid that finishes on a CPU: the reference points, raw confidence at four threshold
    pairs (looser than the paper's, since a small drafter is rarely that confident), two
    lenience values, top-2 and periodic P=4."""
    sig = {"k_min": k_min, "s_max": s_max}
    pts = [_point("ar", "reference"), _point("strict", "reference")]
    pts += [_point("raw", "frontier", eta_b=b, eta_c=c, **sig)
            for b, c in ((0.90, 0.93), (0.80, 0.85), (0.70, 0.70), (0.60, 0.50))]
    pts += [_point("lenience", "frontier", lenience=l) for l in (0.50, 0.30)]
    pts += [_point("topk", "frontier", top_k=2), _point("periodic", "periodic", period=4, period_k=6, s_max=s_max)]
    return pts


#: the risk levels of the prefix scheduler's promise (beyond the paper)
PREFIX_ALPHA = (0.01, 0.02, 0.05, 0.10, 0.20)
PREFIX_LAM = (0.90, 0.70, 0.50)


def _prefix(s_max: int) -> list[GridPoint]:
    """Beyond the paper: the prefix scheduler with its trained model at each promised risk alpha
    (costs measured in the run), and with the confidences' product at three thresholds."""
    pts = [_point("strict", "reference")]
    pts += [_point("prefix", "frontier", survival="model", alpha=a, s_max=s_max) for a in PREFIX_ALPHA]
    pts += [_point("prefix", "frontier", lam=lam, s_max=s_max) for lam in PREFIX_LAM]
    return pts


#: the thresholds the online calibration decodes, from the most cautious down (vskip calibrate-online)
ONLINE_LAM = (0.95, 0.90, 0.85, 0.80, 0.75, 0.70, 0.65, 0.60)
#: the risks it is tested at
ONLINE_ALPHA = (0.05, 0.02)
#: c_D / c_V fixed for the online calibration, so that decisions depend on the tokens alone and
#: calibration and test decode with one policy: Strict SDD's measured ratio at full scale (0.220 on
#: HumanEval, 0.212 on MBPP, docs/results/full/report), rounded
ONLINE_COST_RATIO = 0.22


def _online_cal(s_max: int) -> list[GridPoint]:
    """Beyond the paper: the prefix model at each threshold of :data:`ONLINE_LAM`, the most cautious
    first, so that a sweep stopped early holds the top of the grid, which the calibration reads."""
    return [_point("prefix", "frontier", survival="model", lam=lam, cost_ratio=ONLINE_COST_RATIO, s_max=s_max)
            for lam in ONLINE_LAM]


def _online_test(s_max: int) -> list[GridPoint]:
    """Strict SDD and the online-calibrated prefix model at each risk of :data:`ONLINE_ALPHA`."""
    return [_point("strict", "reference")] + [
        _point("prefix", "frontier", survival="model", alpha=a, cost_ratio=ONLINE_COST_RATIO, s_max=s_max)
        for a in ONLINE_ALPHA]


def _full(s_max: int) -> list[GridPoint]:
    """The full-scale evidence (docs/results/full.md): the cpu-signals and prefix grids together,
    in the order the verdicts need them, so that a sweep stopped early has the most useful part:
    Strict SDD, the promise at the three risks asked for, raw confidence at its three settings and
    at two tighter ones (the paper's gates, 0.90 and 0.93, and 0.95 and 0.97, at k_min 3), whose
    agreement reaches the region of the promise at alpha 0.01 and 0.02 and which Table 4 reads, the
    conditional (its tightest point at the paper's (0.90, 0.90)) and marginal signals, raw (0.70, 0.70) at the other k_min of the paper's values that
    a block of 8 allows (0 and 6; 3 is among the signals) for Eq. 8, the two loosest risks, and last
    the confidence product, which no verdict reads."""
    sig, pre = _cpu_signals(s_max), _prefix(s_max)
    model = [pt for pt in pre if pt.policy.survival == "model"]
    first, last = [pt for pt in model if pt.policy.alpha <= 0.05], [pt for pt in model if pt.policy.alpha > 0.05]
    product = [pt for pt in pre if pt.policy.name == "prefix" and pt.policy.survival != "model"]
    tight = [_point("raw", "frontier", eta_b=b, eta_c=c, k_min=3, s_max=s_max) for b, c in ((0.90, 0.93), (0.95, 0.97))]
    kmin = [pt for pt in _kmin((0, 6), 0.70, 0.70, s_max) if pt.policy.name == "raw"]
    raw, marginal = sig[1:4], sig[4:7]
    # conditional survival's tightest point at the paper's fixed setting (0.90, 0.90), which Table 4
    # reads, in place of the CPU grid's (0.70, 0.90): both skip little, and the grid then holds every
    # signal of Table 4 (raw (0.90, 0.93) is among the tight points, marginal 0.90 among the signals)
    conditional = [_point("conditional", "frontier", eta_b=0.90, eta_c=0.90, k_min=3, s_max=s_max)] + sig[8:10]
    return sig[:1] + first + raw + tight + conditional + marginal + kmin + last + product


#: Named grids: a short description and a builder taking (k_min, s_max).
GRIDS: dict[str, tuple[str, Callable[[int, int], list[GridPoint]]]] = {
    "table5": ("A.6 Table 5: every method's grid and Strict SDD", _table5),
    "kmin": ("Figure 5: raw (0.90, 0.93) at k_min 0..32, and Strict SDD",
             lambda k, s: _kmin(KMIN, 0.90, 0.93, s)),
    "gates": ("Table 2: gate ablation of raw (0.90, 0.93) and conditional (0.90, 0.90)", _gates),
    "periodic": ("Table 3: periodic skipping every P in {3, 4, 8} rounds, and Strict SDD",
                 lambda k, s: _periodic(s)),
    "transfer": ("Table 4: Strict SDD and each signal at its fixed setting", _transfer),
    "cpu-small": ("CPU: ar, strict, raw x4, lenience x2, top-2, periodic P=4", _cpu_small),
    "cpu-kmin": ("CPU: raw (0.70, 0.70) at k_min 0, 3, 6, 12, and Strict SDD",
                 lambda k, s: _kmin((0, 3, 6, 12), 0.70, 0.70, s)),
    "cpu-signals": ("CPU: raw, marginal and conditional survival at three settings each (k_min 3), and Strict SDD",
                    lambda k, s: _cpu_signals(s)),
    "prefix": ("beyond the paper: the prefix scheduler's model at alpha 0.01..0.2, its confidence product at "
               "lam 0.9/0.7/0.5, and Strict SDD", lambda k, s: _prefix(s)),
    "promise": ("beyond the paper: the prefix scheduler's model at the promised alpha 0.05, 0.02 and 0.01 only "
                "(an on-policy round's retrained model; the largest risk, where round 0 broke its promise, first)",
                lambda k, s: sorted((pt for pt in _prefix(s) if pt.policy.survival == "model" and pt.policy.alpha <= 0.05),
                                    key=lambda pt: -pt.policy.alpha)),
    "online-cal": ("beyond the paper: a one-rotation prefix model at lam 0.95 down to 0.60 (cost ratio 0.22), "
                   "decoded on its calibration prompts for `vskip calibrate-online choose`", lambda k, s: _online_cal(s)),
    "online-test": ("beyond the paper: Strict SDD and the online-calibrated prefix model at alpha 0.05 and 0.02 "
                    "(cost ratio 0.22), for its test prompts", lambda k, s: _online_test(s)),
    "full": ("full scale: cpu-signals, prefix, raw (0.90, 0.93) and (0.95, 0.97) at k_min 3, and raw (0.70, "
             "0.70) at k_min 0 and 6; Strict SDD and the promise at alpha <= 0.05 first",
             lambda k, s: _full(s)),
}


def grid(name: str, k_min: int = K_MIN, s_max: int = S_MAX) -> list[GridPoint]:
    """The configurations of a named grid. ``k_min``/``s_max`` apply where the grid does not set
    them (the paper's main sweeps use 6 and 64)."""
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; expected one of {', '.join(GRIDS)}")
    pts = GRIDS[name][1](k_min, s_max)
    names = [p.name for p in pts]
    assert len(set(names)) == len(names), names
    return pts
