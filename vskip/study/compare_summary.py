"""The summary of a ``vskip compare`` directory (:mod:`vskip.study.compare` decodes it): its rows
read back and checked, paired per prompt and repeat, tokens/s as ΣN/ΣT and its ratio to ``ar``
and to Strict SDD with 95% bootstrap intervals over prompts (and each prompt's ratio where they
are fewer than :data:`FEW_PROMPTS`), outputs equal to ``ar``, tokens per verifier call,
StrictToken and FullPrefix (Eqs. 1-2) where a relaxed rule committed drafted tokens, c_D/c_V and
the time outside model forwards; and its text table, which ends with the line that names the
machine. A ratio never pairs two machines' clocks: a prompt whose rows were timed on several
machines is left out, and rows from several machines are marked."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..stats import resample_indices
from .compare import CompareRow, read_rows


#: below this many prompts a percentile bootstrap over prompts has too few distinct resamples to be
#: an interval (4 prompts: 35): the summary gives each prompt's ratio instead
FEW_PROMPTS = 10


def _by_prompt(N, T, N0, T0, common: list[str]) -> dict[str, float]:
    """Each prompt's (N/T) / (N0/T0), its repeats pooled."""
    return {t: float((n / s) / (n0 / s0)) for t, n, s, n0, s0 in zip(common, N, T, N0, T0)}


def _ratio_interval(N, T, N0, T0, reps: int = 2000, seed: int = 0) -> tuple[float, float] | tuple[None, None]:
    """95% percentile bootstrap interval of (ΣN/ΣT) / (ΣN0/ΣT0), resampling prompts; (None, None)
    where some resample's ratio is undefined (a count that is 0 on most prompts, as the drafter
    blocks of rounds that mostly copy)."""
    idx = next(resample_indices(len(N), reps, seed))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (N[idx].sum(1) / T[idx].sum(1)) / (N0[idx].sum(1) / T0[idx].sum(1))
    if not np.all(np.isfinite(r)):
        return None, None
    return float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def rows_of(directory: Path) -> list[CompareRow]:
    """Every row of a comparison directory's shard files."""
    files = sorted(directory.glob("shard-*.jsonl")) + sorted(directory.glob("shard-*.jsonl.gz"))
    return [r for f in files for r in read_rows(f)]


def _totals(res: dict, common: list[str], reps) -> tuple[np.ndarray, np.ndarray]:
    """Per prompt, the tokens and seconds summed over the repeats ``reps``."""
    N = np.array([sum(res[t][q].result.generated_tokens for q in reps) for t in common], float)
    T = np.array([sum(res[t][q].result.decode_seconds for q in reps) for t in common], float)
    return N, T


def summarize_comparison(rows: list[CompareRow], scores: dict[str, dict[str, bool]] | None = None) -> dict:
    """Per configuration, over the prompts every configuration finished in every repeat. Outputs
    are checked on the first repeat; speed pools the repeats (ΣN/ΣT), and ``ratio_by_repeat``
    gives each repeat's ratio to ``ar``: their spread is the timing noise. ``pairwise[a][b]`` sets
    every configuration against every other the same way (ratio, interval, ratio by repeat).
    With ``scores`` (``vskip compare --score``): pass@1 of each configuration over the prompts every
    configuration has a score for, and the prompts where its outcome and ``ar``'s differ."""
    by: dict[str, dict[str, dict[int, CompareRow]]] = {}
    for r in rows:
        by.setdefault(r.config, {}).setdefault(r.task_id, {})[r.repeat] = r
    if "ar" not in by:
        raise ValueError("the comparison has no ar rows to measure against")
    n_rep = 1 + max(r.repeat for r in rows)
    common = sorted(t for t in set.intersection(*(set(v) for v in by.values()))
                    if all(len(by[c][t]) == n_rep for c in by))
    # a ratio never pairs two machines' clocks: a prompt whose rows were timed on several is left out
    split = {t for t in common if len({x.machine for c in by for x in by[c][t].values()}) > 1}
    common = [t for t in common if t not in split]
    ar = {t: by["ar"][t][0] for t in common}
    N0, T0 = _totals(by["ar"], common, range(n_rep))
    out = {"n_prompts": len(common), **({"repeats": n_rep} if n_rep > 1 else {}), "configs": {}}
    for name, res in by.items():
        rs = [res[t][0] for t in common]
        every = [res[t][q] for t in common for q in range(n_rep)]
        N, T = _totals(res, common, range(n_rep))
        same = sum(r.digest == ar[t].digest for r, t in zip(rs, common))
        div = [_first_divergence(r.tokens, ar[t].tokens) for r, t in zip(rs, common)
               if r.digest != ar[t].digest and r.tokens is not None and ar[t].tokens is not None]
        d = {"tokens": int(sum(r.result.generated_tokens for r in rs)), "seconds": float(T.sum()),
             "tokens_per_s": float(N.sum() / T.sum()), "ratio_vs_ar": float((N.sum() / T.sum()) / (N0.sum() / T0.sum())),
             "ratio_ci95": _ratio_interval(N, T, N0, T0),
             **({"ratio_by_prompt": _by_prompt(N, T, N0, T0, common)} if len(common) < FEW_PROMPTS else {}),
             "same_as_ar": same,
             "first_divergence": {"n": len(div), "median": float(np.median(div)) if div else None,
                                  "min": int(min(div)) if div else None}}
        if n_rep > 1:
            per = [(_totals(res, common, [q]), _totals(by["ar"], common, [q])) for q in range(n_rep)]
            d["ratio_by_repeat"] = [float((n.sum() / t.sum()) / (n0.sum() / t0.sum())) for (n, t), (n0, t0) in per]
        if rs and rs[0].result.verifier_calls is not None:
            d |= _cost_figures(every, N.sum(), T.sum())
        out["configs"][name] = d
    # every configuration against every other, paired per prompt: (ΣN/ΣT) of the row over that of the column
    out["pairwise"] = {a: {b: _pair(by[a], by[b], common, n_rep) for b in by if b != a} for a in by}
    if "strict" in by and common and by["strict"][common[0]][0].result.verifier_calls is not None:
        _against_strict(out, by, common)
    if scores:
        _pass_at_1(out, scores, common)
    hosts = sorted({r.machine for r in rows if r.machine})
    if hosts:  # rows written before rows named their machine have no such key
        out["machines"] = hosts
        if len(hosts) > 1:
            out["prompts_by_machine"] = {h: sum(by["ar"][t][0].machine == h for t in common) for h in hosts}
        if split:
            out["prompts_split_across_machines"] = len(split)
    return out


def machine_line(s: dict) -> str:
    """The line a printed speed table ends with: the machine its rows were timed on (several: each
    with its prompts, each prompt paired on one machine; those whose rows span machines are left out)."""
    from ..engine.runtime import machine_name

    hosts = s.get("machines", [])
    if not hosts:
        return "Machine: not recorded (rows written before rows named their machine)."
    if len(hosts) == 1:
        return f"Machine: {machine_name(hosts[0])}."
    counts = s.get("prompts_by_machine", {})
    named = "; ".join(f"{machine_name(h)} ({counts.get(h, 0)} prompts)" for h in hosts)
    split = s.get("prompts_split_across_machines", 0)
    left = f"; {split} prompts timed on several machines left out" if split else ""
    return (f"Machines (mixed): {named}. Each ratio pairs a prompt's rows from one machine; the pooled "
            f"ratios mix the machines{left}.")


def _pass_at_1(out: dict, scores: dict[str, dict[str, bool]], common: list[str]) -> None:
    """pass@1 per configuration over the common prompts every configuration was scored on, with
    the discordant prompts against ``ar`` (passed by one, failed by the other) and an exact
    two-sided sign (McNemar) test of them."""
    from scipy.stats import binomtest

    names = list(out["configs"])
    scored = [t for t in common if all(t in scores.get(c, {}) for c in names)]
    if not scored:
        return
    ar = np.array([scores["ar"][t] for t in scored], bool)
    for name in names:
        mine = np.array([scores[name][t] for t in scored], bool)
        gain, loss = int((mine & ~ar).sum()), int((~mine & ar).sum())
        out["configs"][name] |= {"pass_at_1": float(mine.mean()), "passed": int(mine.sum()), "scored": len(scored),
                                 "discordant_vs_ar": [gain, loss],
                                 "mcnemar_p": float(binomtest(gain, gain + loss).pvalue) if gain + loss else 1.0}


def _pair(res: dict, ref: dict, common: list[str], n_rep: int) -> dict:
    """(ΣN/ΣT) of ``res`` over that of ``ref`` on the prompts ``common``, its 95% bootstrap
    interval over prompts, and, with several repeats, each repeat's ratio."""
    (N, T), (N0, T0) = _totals(res, common, range(n_rep)), _totals(ref, common, range(n_rep))
    d = {"ratio": float((N.sum() / T.sum()) / (N0.sum() / T0.sum())), "ci95": _ratio_interval(N, T, N0, T0)}
    if len(common) < FEW_PROMPTS:
        d["by_prompt"] = _by_prompt(N, T, N0, T0, common)
    if n_rep > 1:
        per = [(_totals(res, common, [q]), _totals(ref, common, [q])) for q in range(n_rep)]
        d["by_repeat"] = [float((n.sum() / t.sum()) / (n0.sum() / t0.sum())) for (n, t), (n0, t0) in per]
    return d


def _against_strict(out: dict, by: dict, common: list[str]) -> None:
    """Verifier calls and draft blocks per generated token relative to Strict SDD's on the same
    prompts (the paper's relative calls and blocks), with 95% bootstrap intervals over prompts, and
    Eq. 8 at Strict SDD's measured costs: ``K* = A c_D / (c_D + c_V)`` with A its tokens per call.
    Counts come from the first repeat: a repeat decodes the same tokens."""
    def per_prompt(res: dict, field: str) -> tuple[np.ndarray, np.ndarray] | None:
        """Counts and tokens per prompt; None where the configuration has no such count
        (transformers' decoders record no calls; a decoder that drafts nothing has no blocks)."""
        c = np.array([_or_nan(getattr(res[t][0].result, field)) for t in common], float)
        if np.isnan(c).any() or not c.any():
            return None
        return c, np.array([res[t][0].result.generated_tokens for t in common], float)

    C0, N0 = per_prompt(by["strict"], "verifier_calls")
    B0, _ = per_prompt(by["strict"], "draft_blocks")
    for name, res in by.items():
        d = out["configs"][name]
        for key, field, ref in (("calls", "verifier_calls", C0), ("blocks", "draft_blocks", B0)):
            mine = per_prompt(res, field)
            if mine is None:  # shown as "–", never as 0
                d[f"rel_{key}"] = None
                continue
            X, N = mine
            d[f"rel_{key}"] = float((X.sum() / N.sum()) / (ref.sum() / N0.sum()))
            d[f"rel_{key}_ci95"] = _ratio_interval(X, N, ref, N0)
    st = out["configs"].get("strict", {})
    if st.get("c_D_ms") and st.get("c_V_ms"):
        from ..engine.policy import break_even_length

        out["eq8"] = {"A": st["tokens_per_call"], "c_D_ms": st["c_D_ms"], "c_V_ms": st["c_V_ms"],
                      "K_star": break_even_length(st["tokens_per_call"], st["c_D_ms"], st["c_V_ms"])}
        b = st["blocks_per_token"] * st["tokens_per_call"]
        if abs(b - 1.0) > 1e-9:  # rounds without a draft of their own (--drafts payoff)
            out["eq8"]["blocks_per_call"] = b



def eq7(s: dict) -> dict | None:
    """Eq. 7 without T_policy, from a summary's measured costs: ``ar`` pays c_V(ar) a token, Strict
    SDD (b c_D + c_V) / A with b its drafts per verification (1 where every round drafts, fewer
    where rounds copy or go without a draft: ``--drafts payoff``), so Strict SDD is predicted at
    A c_V(ar) / (b c_D + c_V) times ``ar``; and what a verification costs in ``ar`` steps, the
    figure that differs from one CPU to another. None without Strict SDD's costs or ``ar``'s."""
    e, step = s.get("eq8"), s["configs"].get("ar", {}).get("c_V_ms")
    if not e or not step:
        return None
    b = e.get("blocks_per_call", 1.0)
    return {"c_V_ar_ms": step, "verify_over_step": e["c_V_ms"] / step, "blocks_per_call": b,
            "predicted_vs_ar": e["A"] * step / (b * e["c_D_ms"] + e["c_V_ms"])}


def _or_nan(x) -> float:
    return np.nan if x is None else x


def _cost_figures(rs: list[CompareRow], n: float, seconds: float) -> dict:
    """Tokens per call, the costs of a draft and a verification, and L, over the rows ``rs``
    (``n`` tokens in ``seconds``)."""
    calls = sum(r.result.verifier_calls for r in rs)
    blocks = sum(r.result.draft_blocks for r in rs)
    draft = sum(r.result.draft_seconds for r in rs)
    verify = sum(r.result.verify_seconds for r in rs)
    if not calls or not n:  # nothing generated, or no verifier call: no per-call figures exist
        return {}
    d = {"tokens_per_call": float(n / calls), "calls_per_token": float(calls / n),
         "c_V_ms": 1000 * verify / calls, "outside_forwards": float((seconds - draft - verify) / seconds)}
    if all(r.agreement is not None for r in rs):  # Eqs. 1-2 (rows written since compare kept their sums)
        num, den, full, n_a = np.sum([r.agreement for r in rs], axis=0) if rs else (0, 0, 0, 0)
        d |= {"strict_token": float(num / den) if den else 1.0, "full_prefix": float(full / n_a) if n_a else 1.0,
              "relaxed_rounds": int(n_a)}
    if blocks:
        acc = [x for r in rs for x in r.accepted or ()]
        d |= {"mean_L": float(np.mean(acc)) if acc else None,
              "p_L_ge1": float(np.mean(np.asarray(acc) >= 1)) if acc else None, "c_D_ms": 1000 * draft / blocks,
              "c_D_over_c_V": (draft / blocks) / (verify / calls), "blocks_per_token": float(blocks / n)}
    return d


def _spread(by_prompt: dict | None, ci: tuple[float, float]) -> str:
    """The table's interval cell: the range of the per-prompt ratios where prompts are few, else the
    bootstrap interval."""
    if by_prompt:
        return f"{min(by_prompt.values()):.3f}–{max(by_prompt.values()):.3f}"
    return f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _with_ci(d: dict, key: str) -> str:
    if d.get(key) is None:
        return "–"
    lo, hi = d[key + "_ci95"]
    if lo is None:
        return f"{d[key]:.3f} [–]"
    return f"{d[key]:.3f} [{lo:.3f}, {hi:.3f}]"


def format_summary(s: dict) -> str:
    from tabulate import tabulate

    def f(x, fmt):
        return "–" if x is None else format(x, fmt)

    # against Strict SDD as well, where the comparison has it (summaries written before had no pairs)
    vs = {a: p["strict"] for a, p in s.get("pairwise", {}).items() if "strict" in p}
    rel = any("rel_calls" in d for d in s["configs"].values())
    agree = any(d.get("relaxed_rounds") for d in s["configs"].values())
    scored = any("pass_at_1" in d for d in s["configs"].values())
    few = any("ratio_by_prompt" in d for d in s["configs"].values())
    rows = []
    for name, d in s["configs"].items():
        row = [name, d["tokens"], f(d["tokens_per_s"], ".2f"), f(d["ratio_vs_ar"], ".3f"),
               _spread(d.get("ratio_by_prompt"), d["ratio_ci95"])]
        if vs:
            v = vs.get(name)
            row += ["–", "–"] if v is None else [f"{v['ratio']:.3f}", _spread(v.get("by_prompt"), v["ci95"])]
        row += [f"{d['same_as_ar']}/{s['n_prompts']}", f(d.get("tokens_per_call"), ".2f")]
        if rel:
            row += [_with_ci(d, "rel_calls"), _with_ci(d, "rel_blocks")]
        if agree:
            row += [f(d.get("strict_token"), ".3f"), f(d.get("full_prefix"), ".3f")]
        if scored:
            won, lost = d.get("discordant_vs_ar", (0, 0))
            row += ["–", "–"] if "pass_at_1" not in d else [f"{d['pass_at_1']:.3f} ({d['passed']}/{d['scored']})",
                                                            f"+{won} −{lost} (p {d['mcnemar_p']:.2f})"]
        rows.append(row + [f(d.get("c_D_over_c_V"), ".3f"), f(d.get("outside_forwards"), ".1%")])
    span = "by prompt: min–max" if few else "95% CI (prompts)"
    table = tabulate(rows, headers=["config", "tokens", "tok/s", "× ar", span,
                                    *(["× strict", "by prompt" if few else "95% CI"] if vs else []), "= ar",
                                    "tokens/call",
                                    *(["rel. calls [95% CI]", "rel. blocks [95% CI]"] if rel else []),
                                    *(["StrictToken", "FullPrefix"] if agree else []),
                                    *(["pass@1", "vs ar: +won −lost"] if scored else []), "c_D/c_V",
                                    "outside forwards"], tablefmt="github")
    if "eq8" in s:
        e = s["eq8"]
        table += (f"\n\nrel. calls and blocks: per generated token, over Strict SDD's on the same prompts. Eq. 8 at "
                  f"Strict SDD's measured costs: A = {e['A']:.3f} tokens per call, c_D = {e['c_D_ms']:.1f} ms, "
                  f"c_V = {e['c_V_ms']:.1f} ms, K* = A c_D / (c_D + c_V) = {e['K_star']:.3f}.")
        p = eq7(s)
        if p is not None:
            table += (f"\nOn this machine a verification costs {p['verify_over_step']:.2f} ar steps (c_V = "
                      f"{e['c_V_ms']:.1f} ms against {p['c_V_ar_ms']:.1f} ms). Eq. 7 from these costs gives Strict "
                      + (f"SDD A c_V(ar) / (c_D + c_V) = " if abs(p["blocks_per_call"] - 1) < 1e-9 else
                         f"SDD, with b = {p['blocks_per_call']:.3f} drafts per verification, A c_V(ar) / (b c_D + c_V) = ")
                      + f"{p['predicted_vs_ar']:.3f}× ar (measured "
                      f"{s['configs']['strict']['ratio_vs_ar']:.3f}×; the difference is the time outside the "
                      f"forwards): a CPU whose verification costs more steps gains less from the same A.")
    if few:
        table += (f"\n\n{s['n_prompts']} prompts are too few for a bootstrap interval over prompts; × ar by prompt:\n"
                  + "\n".join(f"- {name}: " + ", ".join(f"{x:.3f}" for x in d["ratio_by_prompt"].values())
                               for name, d in s["configs"].items() if name != "ar"))
    if s.get("repeats", 1) > 1:
        table += f"\n\nEach prompt decoded {s['repeats']} times by every configuration; × ar by repeat:\n"
        table += "\n".join(f"- {name}: " + ", ".join(f"{x:.3f}" for x in d["ratio_by_repeat"])
                            for name, d in s["configs"].items() if name != "ar")
        if vs:
            table += "\n\n× strict by repeat:\n" + "\n".join(
                f"- {name}: " + ", ".join(f"{x:.3f}" for x in v["by_repeat"]) for name, v in vs.items() if "by_repeat" in v)
    return table + "\n\n" + machine_line(s)
