"""bench_batch's figure of a protocol directory (OUT/throughput.png)."""

from __future__ import annotations

from pathlib import Path


def protocol_figure(record: dict, path: Path) -> Path | None:
    """OUT/throughput.png: for each (machine, decode) pooled, every configuration's throughput
    against batched ``ar`` at the same B (with its 95% interval over chunks, where there are
    several) and its tokens/s, over the batch sizes."""
    if not record["machines"]:
        return None
    from vskip.files import save_figure
    from vskip.report.figures import _pyplot

    plt = _pyplot()
    ms = record["machines"]
    fig, axes = plt.subplots(len(ms), 2, figsize=(11, 4 * len(ms)), squeeze=False)
    for (left, right), m in zip(axes, ms):
        names = list(dict.fromkeys(r["config"] for r in m["rows"]))
        for i, n in enumerate(names):
            rs = sorted((r for r in m["rows"] if r["config"] == n), key=lambda r: r["batch"])
            bs = [r["batch"] for r in rs]
            right.plot(bs, [r["throughput"] for r in rs], "o-", color=f"C{i}", label=n)
            if n == "ar":
                continue
            x = [r["x_ar_same_batch"] for r in rs]
            lo = [r["x_ar_same_batch"] - r["x_ar_ci95"][0] for r in rs]
            hi = [r["x_ar_ci95"][1] - r["x_ar_same_batch"] for r in rs]
            left.errorbar(bs, x, yerr=[lo, hi] if len(m["chunks"]) > 1 else None, fmt="o-", color=f"C{i}",
                          capsize=3, label=n)
        left.axhline(1.0, color="grey", lw=0.8, ls="--")
        left.set(xscale="log", xlabel="batch size B", ylabel="tok/s against batched ar at B",
                 title=f"{record['protocol']['task']}: {m['prompts']} prompts, {len(m['chunks'])} "
                       f"chunk{'s' if len(m['chunks']) != 1 else ''}")
        right.set(xscale="log", xlabel="batch size B", ylabel="generated tok/s (all sequences)",
                  title=f"decode code {m.get('engine') or 'not recorded'}")
        for ax in (left, right):
            ax.set_xticks(bs, [str(b) for b in bs])
            ax.minorticks_off()
            ax.legend(fontsize=8)
    fig.text(0.5, 0.005, f"Machine: {ms[0]['machine']}" if len(ms) == 1 else "", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    out = save_figure(fig, path)
    plt.close(fig)
    return out

