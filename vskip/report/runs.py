"""How a report names and orders runs: labels, colours, the frontier methods and the sort columns
(reading the run directories themselves is :mod:`vskip.study.rundir`'s)."""

from __future__ import annotations

from ..defaults import POLICY_PARAMETERS
from ..study.rundir import Run

LABELS = {
    "ar": "AR (verifier alone)", "strict": "Strict SDD", "lenience": "Lenience", "topk": "Top-k",
    "periodic": "Periodic", "raw": "Raw confidence", "marginal": "Marginal survival",
    "conditional": "Conditional survival", "prefix": "Prefix (cost-aware)",
    "prefix-model": "Prefix model (promised agreement)",
}
#: Methods drawn as frontiers (Figures 1 and 4), in legend order; ``prefix-model`` is the prefix
#: scheduler reading its trained survival model, ``prefix`` the one reading the confidences' product.
FRONTIER_METHODS = ("raw", "marginal", "conditional", "prefix", "prefix-model", "lenience", "topk", "periodic")
COLORS = {"raw": "C0", "marginal": "C1", "conditional": "C2", "lenience": "C3", "topk": "C4", "periodic": "C5",
          "prefix": "C6", "prefix-model": "C7"}
#: the parameters of the paper's methods (not the prefix policy's own), which order a report's rows
PARAMS = tuple(k for k, p in POLICY_PARAMETERS.items() if p.field and set(p.methods) - {"prefix"})
TIMING_FIELDS = ("decode_seconds", "draft_seconds", "verify_seconds")


def _labels(runs: list[Run]) -> None:
    """Each run's display name: its directory name, or, where any name repeats (runs of several
    tasks), parent/name for every run, so that a label does not depend on which other runs exist."""
    names = [r.path.name for r in runs]
    repeats = len(set(names)) < len(names)
    for r in runs:
        r.label = f"{r.path.parent.name}/{r.path.name}" if repeats else r.path.name
