"""``vskip report``: frontiers, tables and figures of the paper from run directories, no model.

Reads run directories (or sweep directories holding them) and writes, under ``--out``:

- ``runs_<group>.{md,csv}``: every run against the Strict SDD run of the same task and prompts
  (relative verifier calls and draft blocks per generated token, tokens/s, pass@1 with a paired
  bootstrap interval of its difference, StrictToken Eq. 1, FullPrefix Eq. 2, skipped rounds);
- ``intervals_<group>.{md,csv}``: paired bootstrap intervals over prompts of relative calls,
  relative blocks, StrictToken and FullPrefix, the prompts whose output equals ``ar``'s (exact),
  and an exact bound on |Δpass@1| from the discordant prompts;
- ``fig1_<group>.png`` (strict token agreement vs tokens/s) and ``fig4_<group>.png`` (pass@1 and
  agreement vs relative calls): each method's Pareto frontier over its grid, dominated settings
  faded;
- ``fig5_<group>_<n>.png`` and ``kmin_<group>.{md,csv}``: the ``k_min`` diagnostic, with the
  break-even length ``K*`` of Eq. 8 from measured ``c_D``, ``c_V`` and Strict SDD's ``A``;
- ``eq8_<group>.{md,csv}``, ``table2_<group>``, ``table3_<group>``, ``matched_<group>`` (§5.2) and
  ``table4`` (all tasks);
- ``report.md`` laying them out with the configuration and command behind each.

A group is one task at one ``gamma``. What cannot be produced (missing files or fields, unfinished
runs, no Strict SDD reference) is said in ``report.md`` and on stderr; the rest is still written.
"""

from .build import build_report
from .figures import frontiers
from .paired import Metrics, Row, compare, compute_metrics
from .tables import kmin_families, pareto_front

__all__ = ["build_report", "Metrics", "Row", "compare", "compute_metrics", "frontiers", "kmin_families", "pareto_front"]
