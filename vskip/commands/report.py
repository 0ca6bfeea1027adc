"""``vskip report``: frontiers, tables and figures from finished runs (no model needed)."""

from __future__ import annotations

import json
from pathlib import Path

from ..defaults import K_MIN
from .flags import MAX_SEED, bounded


def register(subparsers) -> None:
    r = subparsers.add_parser(
        "report", help="frontiers, tables and figures from finished runs (no model needed)",
        description="Read run directories (or sweep directories holding them) and write the paper's frontiers "
                    "(Figures 1, 4, 5), tables (2, 3, 4), the matched-quality comparison, bootstrap intervals and "
                    "the Eq. 8 break-even analysis as PNG, Markdown and CSV, laid out in report.md.",
    )
    r.add_argument("dirs", nargs="+", help="run directories or directories holding them")
    r.add_argument("--out", required=True, help="output directory")
    r.add_argument("--frontier-k-min", dest="k_min", type=int, default=K_MIN,
                   help=f"the k_min of the signal runs drawn as frontiers (default: {K_MIN})")
    r.add_argument("--bootstrap", type=bounded(int, 1, 10_000_000), default=10_000, help="paired bootstrap resamples (default: 10000)")
    r.add_argument("--seed", type=bounded(int, 0, MAX_SEED), default=0, help="bootstrap seed (default: 0)")
    r.add_argument("--timing", nargs="+", metavar="COMPARE_DIR", default=[],
                   help="`vskip compare --repeats` directories: the promise's runs also get their tokens/s against "
                        "Strict SDD from the configuration there that decodes as they did (interleaved, repeated, "
                        "paired per prompt), beside the run's own single timing")
    r.add_argument("--include-partial", action="store_true",
                   help="also draw runs that hold fewer prompts than the fullest run of their task and gamma in the "
                        "figures and frontiers (they are always in the tables, marked partial)")
    r.add_argument("--archive", action="store_true",
                   help="also write OUT/runs.tar.xz: the run files behind the report (configs, samples, rounds, "
                        "summaries; no traces), so it can be regenerated from what is committed")
    r.set_defaults(fn=cmd_report)



def cmd_report(a) -> int:
    from ..report.build import ARCHIVE, archive_runs, build_report

    if a.bootstrap < 1:
        raise ValueError(f"--bootstrap must be >= 1, got {a.bootstrap}")
    for d in a.timing:
        if not (Path(d) / "settings.json").is_file():
            raise ValueError(f"--timing {d} is not a comparison directory (no settings.json)")
    from ..files import DirLock, check_writable_dir

    with DirLock(check_writable_dir(a.out, "report directory"), "report directory"):
        rep = build_report([Path(p) for p in a.dirs], Path(a.out), k_min=a.k_min, n_boot=a.bootstrap, seed=a.seed,
                           command=getattr(a, "command_line", None), timing=[Path(d) for d in a.timing],
                           include_partial=a.include_partial)
        if getattr(a, "archive", False):
            rep.files.append(archive_runs(rep, Path(a.out) / ARCHIVE).name)
    print(json.dumps({"report": str(rep.path), "files": len(rep.files), "notes": len(rep.notes)}))
    return 0
