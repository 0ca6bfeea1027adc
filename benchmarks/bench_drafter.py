"""Drafter quality under Strict SDD from finished ``vskip run`` directories (``--policy ar`` and
``--policy strict`` at each gamma over the same prompts): for each gamma, the mean accepted length
L, its histogram, P(L >= j), generated tokens per verifier call, c_D / c_V, and tokens/s against the
verifier's own greedy decoding (``ar``). It decodes nothing itself (``vskip run`` does). Usage::

    python benchmarks/bench_drafter.py --runs runs/ar runs/strict-g8 runs/strict-g16 --out docs/results/drafter
    python benchmarks/bench_drafter.py --runs runs/he64-net runs/he64-default --reference runs/he512 --out DIR

``--reference`` checks each run's outputs against the verifier's own (``ar``) outputs of another run over
the same prompts at an equal or larger budget (a ``vskip run --policy ar`` directory or a ``vskip compare``
directory): greedy decoding is a prefix property, so the first ``max_new_tokens`` of a longer answer are
the answer at the shorter budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tabulate import tabulate

from vskip.engine.metrics import acceptance_histogram, summarize, survival_curve
from vskip.study.rundir import ROUNDS, SAMPLES, read_rounds, read_rows


def measure(s: dict, rounds: list, gamma: int | None) -> dict:
    """The figures of one configuration from its summary (:func:`vskip.engine.metrics.summarize`) and its
    rounds (``L`` and ``gamma`` of each)."""
    res = {"tokens": int(s["generated_tokens"]), "seconds": s["decode_seconds"], "tok_s": s["tokens_per_s"],
           "tokens_per_call": s["generated_tokens"] / s["verifier_calls"], "c_V_ms": 1000 * s["c_V"]}
    if gamma is not None:
        hist = acceptance_histogram(rounds, gamma)
        full = [x.L for x in rounds if x.gamma == gamma]
        res |= {
            "mean_L": sum(full) / len(full),
            "histogram": hist,
            "p_L_ge": survival_curve(hist),
            "c_D_ms": 1000 * s["c_D"],
            "c_D_over_c_V": s["c_D"] / s["c_V"],
        }
    return res


def _samples(d: Path) -> list[dict]:
    return read_rows(d / SAMPLES)


def from_runs(dirs: list[str], common: bool = False) -> tuple[dict, str, dict]:
    """The same figures from run directories written by ``vskip run`` (one per configuration:
    ``--policy ar`` and ``--policy strict`` at each gamma over the same prompts), and the settings
    each run recorded itself. ``common``: only the prompts every run finished, totals summed from
    the runs' samples."""
    results, prompts, settings = {}, set(), {}
    shared = set.intersection(*({r["task_id"] for r in _samples(Path(d))} for d in dirs)) if common else None
    for d in map(Path, dirs):
        cfg = json.loads((d / "config.json").read_text())["run"]
        settings[str(d)] = {"task": cfg["task"], "limit": cfg.get("limit"), "ids": cfg.get("ids"),
                            "policy": cfg["policy"]["name"], "decode": cfg["decode"], "models": cfg["models"]}
        s = json.loads((d / "summary.json").read_text())
        pol, g = cfg["policy"]["name"], cfg["decode"]["gamma"]
        rounds = read_rounds(d / ROUNDS)
        if shared is not None:
            rounds = [r for r in rounds if r.task_id in shared]
            s = summarize([r for r in _samples(d) if r["task_id"] in shared], rounds)
        models = cfg["models"] or {}
        net = " network" if models.get("copy_prior") == "off" else ""  # --copy-prior off
        net += f" {models['drafter_dtype']} drafter" if models.get("drafter_dtype") not in (None, "auto") else ""
        name = "ar" if pol == "ar" else f"gamma={g}{net}"
        if name in results:
            raise SystemExit(f"bench_drafter: two runs would both be reported as {name!r}")
        results[name] = measure(s, rounds, None if pol == "ar" else g)
        prompts.add(s["n_prompts"])
        mnt = cfg["decode"]["max_new_tokens"]
    head = f"prompts={'/'.join(map(str, sorted(prompts)))} max_new_tokens={mnt} from run directories"
    return results, head, {"source": "run directories", "runs": settings}


def reference_outputs(directory: str) -> dict[str, list[int]]:
    """The ``ar`` outputs (token ids) per prompt of a ``vskip run --policy ar`` or ``vskip compare`` directory."""
    d = Path(directory)
    if (d / "samples.jsonl").exists():
        if json.loads((d / "config.json").read_text())["run"]["policy"]["name"] != "ar":
            raise SystemExit(f"bench_drafter: --reference {d} is not an ar run")
        return {r["task_id"]: r["tokens"] for r in _samples(d)}
    from vskip.study.compare_summary import rows_of

    ref = {r.task_id: r.tokens for r in rows_of(d) if r.config == "ar" and r.tokens is not None}
    if not ref:
        raise SystemExit(f"bench_drafter: --reference {d} holds no ar outputs")
    return ref


def same_as_reference(run_dirs: list[str], ref: dict[str, list[int]]) -> dict[str, dict]:
    """Per run directory: how many of its prompts' outputs equal the reference's first max_new_tokens."""
    out = {}
    for d in map(Path, run_dirs):
        mnt = json.loads((d / "config.json").read_text())["run"]["decode"]["max_new_tokens"]
        rows = _samples(d)
        missing = [r["task_id"] for r in rows if r["task_id"] not in ref]
        if missing:
            raise SystemExit(f"bench_drafter: the reference has no ar output for {missing[0]} (and {len(missing) - 1} more)")
        same = sum(r["tokens"] == ref[r["task_id"]][:mnt] for r in rows)
        out[str(d)] = {"same_as_ar": same, "n_prompts": len(rows)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", nargs="+", metavar="DIR", required=True,
                    help="finished `vskip run` directories (ar and strict at each gamma)")
    ap.add_argument("--common", action="store_true",
                    help="with --runs: only the prompts every run finished (a paired comparison)")
    ap.add_argument("--reference", metavar="DIR",
                    help="with --runs: check every run's outputs against the ar outputs of this run or compare directory")
    ap.add_argument("--out", help="directory for results.json and results.md")
    a = ap.parse_args(argv)
    results, head, settings = from_runs(a.runs, a.common)
    lossless = same_as_reference(a.runs, reference_outputs(a.reference)) if a.reference else None
    for k, r in results.items():  # without an `ar` run there is no speed ratio
        r["speedup_vs_ar"] = r["tok_s"] / results["ar"]["tok_s"] if "ar" in results else None
    rows = [[k, r["tokens"], f"{r.get('mean_L', float('nan')):.2f}", f"{r['tokens_per_call']:.2f}",
             f"{r.get('c_D_ms', float('nan')):.1f}", f"{r.get('c_V_ms', float('nan')):.1f}",
             f"{r.get('c_D_over_c_V', float('nan')):.2f}", f"{r['tok_s']:.2f}",
             "–" if r["speedup_vs_ar"] is None else f"{r['speedup_vs_ar']:.3f}"]
            for k, r in results.items()]
    table = tabulate(rows, headers=["config", "tokens", "mean L", "tok/call", "c_D ms", "c_V ms", "c_D/c_V", "tok/s", "x ar"])
    lines = [table, head]
    if lossless:
        settings["reference"] = a.reference
        lines += [f"{d}: {v['same_as_ar']}/{v['n_prompts']} outputs equal to ar ({a.reference})" for d, v in lossless.items()]
    for k, r in results.items():
        if "p_L_ge" in r:
            lines.append(f"{k}: P(L>=j) j=1.. " + " ".join(f"{p:.3f}" for p in r["p_L_ge"]))
            lines.append(f"{k}: histogram of L (0..gamma) " + " ".join(str(c) for c in r["histogram"]))
    print("\n".join(lines))
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({"command": "python benchmarks/bench_drafter.py " + " ".join(sys.argv[1:] if argv is None else argv),
                                                    "settings": settings, "results": results,
                                                    "same_as_ar": lossless}, indent=1))
        (out / "results.md").write_text("```\n" + "\n".join(lines) + "\n```\n")
        plot(results, out / "acceptance.png")
    return 0


def plot(results: dict, path: Path) -> None:
    """P(L >= j) per gamma, and the histogram of L."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for k, r in results.items():
        if "p_L_ge" not in r:
            continue
        j = range(1, len(r["p_L_ge"]) + 1)
        a1.plot(j, r["p_L_ge"], marker=".", label=k)
        h = r["histogram"]
        a2.plot(range(len(h)), [c / max(1, sum(h)) for c in h], marker=".", label=k)
    a1.set(xlabel="position j", ylabel="P(L >= j)", yscale="log", title="per-position acceptance")
    a2.set(xlabel="accepted length L", ylabel="share of full blocks", yscale="log", title="histogram of L")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
