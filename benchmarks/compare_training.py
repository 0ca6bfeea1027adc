"""Two drafter training runs side by side, step for step. Runs of the same data, seed and batch
settings train on the same batches at every step (a step's batch depends on the seed and the step
alone), so their training losses are paired: a difference at equal steps is the model's, not the
batches'. Prints the mean loss of each run over windows of steps and their held-out figures at the
steps both evaluated, and plots the losses::

    python benchmarks/compare_training.py runs/drafter-v2 runs/drafter-l12 --upto 250 --window 50 \
        --out docs/results/drafter-v3/probe-l12
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

#: settings that decide each step's batch
BATCH_KEYS = ("seed", "batch_seqs", "blocks_per_seq", "gamma", "max_context", "full_mask_share", "holdout",
              "early_share", "early_tokens")


def load(run: Path) -> tuple[dict, list[dict], dict]:
    from vskip.distill.train import read_state_meta

    if not (run / "train_state.safetensors").exists():
        raise SystemExit(f"compare_training: {run} is not a drafter training directory")
    from dataclasses import asdict

    from vskip.distill.config import TrainConfig

    meta = read_state_meta(run)
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    # settings an older run did not record take their defaults
    return asdict(TrainConfig(**{"copy_input": False, **meta["config"]})), meta.get("log", []), config


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs=2, metavar="TRAIN_DIR")
    ap.add_argument("--upto", type=int, help="compare steps 1..N (default: the steps both ran)")
    ap.add_argument("--window", type=int, default=50, help="steps per mean (default: 50)")
    ap.add_argument("--out", help="directory for results.json, results.md and losses.png")
    a = ap.parse_args(argv)
    from tabulate import tabulate

    (ca, la, ra), (cb, lb, rb) = (load(Path(r)) for r in a.runs)
    differ = [k for k in BATCH_KEYS if ca[k] != cb[k]]
    if differ or (ra.get("data_files") and rb.get("data_files") and ra["data_files"] != rb["data_files"]):
        raise SystemExit(f"compare_training: the runs do not train on the same batches ({', '.join(differ) or 'data files'} differ)")
    if ca.get("init_from") or cb.get("init_from"):
        raise SystemExit("compare_training: a warm-started run's steps do not line up with a fresh run's")
    loss_a = {e["step"]: e["loss"] for e in la if "loss" in e}
    loss_b = {e["step"]: e["loss"] for e in lb if "loss" in e}
    upto = a.upto or min(max(loss_a), max(loss_b))
    steps = [s for s in range(1, upto + 1) if s in loss_a and s in loss_b]
    if not steps:
        raise SystemExit("compare_training: no step that both runs logged")
    names = [Path(r).name for r in a.runs]
    windows = []
    for lo in range(0, upto, a.window):
        w = [s for s in steps if lo < s <= lo + a.window]
        if w:
            x, y = np.array([loss_a[s] for s in w]), np.array([loss_b[s] for s in w])
            windows.append({"steps": f"{lo + 1}-{lo + a.window}", "n": len(w), "loss_a": float(x.mean()),
                            "loss_b": float(y.mean()), "b_lower_share": float((y < x).mean())})
    ev_a = {e["step"]: e for e in la if "holdout" in e}
    ev_b = {e["step"]: e for e in lb if "holdout" in e}
    evals = [{"step": s, "top1_a": ev_a[s]["holdout"]["first_step_top1"], "top1_b": ev_b[s]["holdout"]["first_step_top1"],
              "tpc_a": ev_a[s]["holdout"]["tokens_per_call"], "tpc_b": ev_b[s]["holdout"]["tokens_per_call"]}
             for s in sorted(set(ev_a) & set(ev_b)) if s <= upto]
    layers = [c.get("num_layers") for c in (ca, cb)]
    t1 = tabulate([[w["steps"], f"{w['loss_a']:.3f}", f"{w['loss_b']:.3f}", f"{w['b_lower_share']:.2f}"] for w in windows],
                  headers=["steps", f"loss {names[0]} ({layers[0]} layers)", f"loss {names[1]} ({layers[1]} layers)",
                           f"share of steps {names[1]} lower"])
    t2 = tabulate([[e["step"], f"{e['top1_a']:.4f}", f"{e['top1_b']:.4f}", f"{e['tpc_a']:.2f}", f"{e['tpc_b']:.2f}"]
                   for e in evals],
                  headers=["step", f"top-1 {names[0]}", f"top-1 {names[1]}", f"tok/call {names[0]}",
                           f"tok/call {names[1]}"]) if evals else "(no step that both evaluated)"
    head = "training loss on the same batches (mean over each window); held-out figures at the steps both evaluated"
    print(t1 + "\n\n" + t2 + "\n" + head)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        cmd = "python benchmarks/compare_training.py " + " ".join(sys.argv[1:] if argv is None else argv)
        from vskip.files import write_atomic, write_json

        write_json(out / "results.json", {"command": cmd, "runs": list(a.runs), "layers": layers,
                                          "windows": windows, "evals": evals})
        write_atomic(out / "results.md", f"`{cmd}`\n\n```\n{t1}\n\n{t2}\n{head}\n```\n")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.4))
        for name, loss, n in ((names[0], loss_a, layers[0]), (names[1], loss_b, layers[1])):
            y = np.array([loss[s] for s in steps])
            k = min(10, len(y))
            ax.plot(steps[k - 1:], np.convolve(y, np.ones(k) / k, "valid"), label=f"{name} ({n} layers)")
        ax.set(xlabel="step (same batches)", ylabel=f"training loss (mean of {min(10, len(steps))} steps)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "losses.png", dpi=120)
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
