"""The report's figures (1, 4 and 5), drawn with matplotlib."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..files import save_figure
from .paired import Row
from .runs import COLORS, FRONTIER_METHODS, LABELS
from .tables import KminFamily, frontier_method, in_main_grid, pareto_front

# --------------------------------------------------------------------------- figures


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def frontiers(rows: list[Row], x: Callable, y: Callable, x_max: bool, y_max: bool, k_min: int) -> dict:
    """Per method of :data:`FRONTIER_METHODS`: ``[(row, on_frontier)]`` over its main-grid runs
    with both coordinates known. Prefix-model runs that read different predictors (on-policy rounds
    beside round 0) get a frontier each, keyed ``prefix-model@PREDICTOR``."""
    out = {}
    for m in FRONTIER_METHODS:
        pts = [r for r in rows if frontier_method(r) == m and in_main_grid(r, k_min) and x(r) is not None
               and y(r) is not None]
        groups = {m: pts}
        if m == "prefix-model" and len({_predictor(r) for r in pts}) > 1:
            groups = {}
            for r in pts:
                groups.setdefault(f"{m}@{_predictor(r)}", []).append(r)
        for key, ps in groups.items():
            if ps:
                out[key] = list(zip(ps, pareto_front([x(r) for r in ps], [y(r) for r in ps], x_max, y_max)))
    return out


def _predictor(row: Row) -> str:
    return str(row.run.run_cfg.get("predictor"))


def _style(key: str, i: int) -> tuple[str, str]:
    """(colour, legend label) of a frontier key of :func:`frontiers`."""
    m, _, predictor = key.partition("@")
    if not predictor:
        return COLORS[m], LABELS[m]
    return f"C{7 + i % 3}", f"{LABELS[m]}, {Path(predictor).name}"


def _frontier_panel(ax, rows: list[Row], strict: Row | None, x: Callable, y: Callable, x_max: bool, y_max: bool,
                    xlabel: str, ylabel: str, k_min: int) -> list[str]:
    """Draw each method's frontier (solid) and its dominated settings (faded) on ``ax``; returns
    the names of the runs drawn."""
    drawn = []
    for i, (m, pts) in enumerate(sorted(frontiers(rows, x, y, x_max, y_max, k_min).items(),
                                        key=lambda kv: (FRONTIER_METHODS.index(kv[0].partition("@")[0]), kv[0]))):
        color, label = _style(m, i)
        on = sorted((x(r), y(r)) for r, f in pts if f)
        off = [(x(r), y(r)) for r, f in pts if not f]
        ax.plot([a for a, _ in on], [b for _, b in on], "-o", color=color, label=label, ms=5)
        if off:
            ax.plot([a for a, _ in off], [b for _, b in off], "o", color=color, alpha=0.25, ms=5)
        drawn += [r.name for r, _ in pts]
    if strict is not None and x(strict) is not None and y(strict) is not None:
        ax.plot([x(strict)], [y(strict)], "k*", ms=12, label="Strict SDD")
        drawn.append(strict.name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7)
    return drawn


def figure1(path: Path, title: str, rows: list[Row], strict: Row | None, k_min: int) -> list[str]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    drawn = _frontier_panel(ax, rows, strict, lambda r: r.m.tokens_per_s, lambda r: r.m.strict_token, True, True,
                            "tokens/s", "strict token agreement", k_min)
    ax.set_title(f"Figure 1: {title}", fontsize=9)
    fig.tight_layout()
    if drawn:
        save_figure(fig, path)
    plt.close(fig)
    return drawn


def _two_panels(path: Path, suptitle: str, rows: list[Row], strict: Row | None, k_min: int, panels) -> list[str]:
    """Two frontier panels side by side; ``panels``: two (x, y, x_max, y_max, xlabel, ylabel)."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    drawn = []
    for ax, (x, y, x_max, y_max, xlabel, ylabel) in zip(axes, panels):
        drawn += _frontier_panel(ax, rows, strict, x, y, x_max, y_max, xlabel, ylabel, k_min)
    fig.suptitle(suptitle, fontsize=9)
    fig.tight_layout()
    drawn = list(dict.fromkeys(drawn))
    if drawn:
        save_figure(fig, path)
    plt.close(fig)
    return drawn


def figure4(path: Path, title: str, rows: list[Row], strict: Row | None, k_min: int) -> list[str]:
    return _two_panels(path, f"Figure 4: {title}", rows, strict, k_min, [
        (lambda r: r.rel_calls, lambda r: r.pass_common, False, True, "relative verifier calls", "pass@1"),
        (lambda r: r.rel_calls, lambda r: r.m.strict_token, False, True, "relative verifier calls",
         "strict token agreement")])


def figure_disagreement(path: Path, title: str, rows: list[Row], strict: Row | None, k_min: int) -> list[str]:
    """Beyond the paper: relative verifier calls and the Eq. 7 speedup at Strict SDD's costs
    against the share of generated tokens committed beyond the shadow verifier's L."""
    return _two_panels(path, f"Calls and speed against disagreement: {title}", rows, strict, k_min, [
        (lambda r: r.rel_calls, lambda r: r.disagreement, False, False, "relative verifier calls",
         "disagreement per generated token"),
        (lambda r: r.eq7_speedup, lambda r: r.disagreement, True, False, "speedup over Strict SDD, Eq. 7 at its costs",
         "disagreement per generated token")])


def figure5(path: Path, title: str, fam: KminFamily) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    ks = [r.p("k_min") for r in fam.rows]
    for ax, (label, f) in zip(axes, (("relative verifier calls", lambda r: r.rel_calls),
                                     ("relative draft blocks", lambda r: r.rel_blocks),
                                     ("tokens/s", lambda r: r.m.tokens_per_s))):
        pts = [(k, f(r)) for k, r in zip(ks, fam.rows) if f(r) is not None]
        ax.plot([k for k, _ in pts], [v for _, v in pts], "-o", color=COLORS.get(fam.policy, "C0"))
        if fam.K_star is not None:
            ax.axvline(fam.K_star, color="k", ls="--", lw=1, label=f"K* = {fam.K_star:.2f} (Eq. 8)")
            ax.legend(fontsize=7)
        ax.set_xlabel("k_min")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(f"Figure 5: {title}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
