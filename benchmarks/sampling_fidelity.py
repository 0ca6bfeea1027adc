"""Whether sampled completions follow the verifier's own distribution, token by token.

A sampler of the verifier's warped distribution p (``ar``, or Strict SDD with either rule) draws
each token x_k from p_k, the distribution given the tokens before it. Then the score
s_k = log p_k(x_k) + H(p_k) has mean 0 given the prefix, and variance v_k = Var_{x~p_k}[log p_k(x)];
summed over every position of every completion, S = sum s_k is a martingale, so z = S / sqrt(sum v_k)
is close to a standard normal draw. A sampler that favours tokens the verifier finds likelier
than it should (or less likely: a drafter's preferences leaking into what is committed) moves z
by several units within a few thousand tokens, long before pass@k could tell.

This recomputes p_k with the embedded verifier (teacher-forced: the prompt's forward once, then
each completion of that prompt on its cache; float32 logits warped in float64) for every completion of vskip's
samples files (``vskip run --samples-per-prompt`` writes them; gzipped too), and writes z with
its parts: the tokens scored, the mean of log p_k(x_k) and of -H(p_k). The files of one sampler
are scored together; give each sampler its own ``--files``.

    python benchmarks/sampling_fidelity.py --task humaneval --temperature 0.6 \\
      --files ar docs/results/sampling/passk/ar-T0.6-n10/part-*/samples.jsonl.gz \\
      --files strict-spec docs/results/sampling/passk/strict-spec-T0.6-n10/part-*/samples.jsonl.gz \\
      --out docs/results/sampling/passk/fidelity.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch


def scores(logits: torch.Tensor, tokens: torch.Tensor, sampling) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row of ``logits`` [n, V] and its drawn token: (log p(x), -H(p), Var_{x~p} log p(x))
    of the warped distribution p (``vskip.engine.models.sampling.warped_probs``). A drawn token
    without mass has log p = -inf: no sampler of p could have drawn it."""
    from vskip.engine.models.sampling import warped_probs

    p = warped_probs(logits, sampling)
    logp = torch.log(p)
    plogp = torch.where(p > 0, p * logp, torch.zeros_like(p))
    neg_h = plogp.sum(-1)
    second = torch.where(p > 0, p * logp * logp, torch.zeros_like(p)).sum(-1)
    drawn = logp.gather(-1, tokens[:, None])[:, 0]
    return drawn.numpy(), neg_h.numpy(), (second - neg_h**2).clamp_min(0).numpy()


def teacher_forced_logits(model, prompt: list[int], completions: list[list[int]]) -> list[torch.Tensor]:
    """For each completion x_1..x_n of ``prompt``: the verifier's logits [n, V] of x_k given the prompt
    and x_1..x_{k-1}. The prompt runs once; each completion then runs on its cache, which is cropped
    back to the prompt after it (a padded batch of completions would compute every row at the
    longest one's length: more positions than it saves). Equal to one forward over prompt +
    completion per row up to float32 rounding."""
    from transformers import DynamicCache

    from vskip.engine.models.verifier import _cache_kwarg

    arg = _cache_kwarg(model)  # "cache" where transformers has renamed past_key_values
    out = []
    with torch.inference_mode():
        cache = DynamicCache()
        first = model(input_ids=torch.tensor([prompt]), use_cache=True, **{arg: cache}).logits[0, -1:]
        for c in completions:
            if len(c) <= 1:
                out.append(first[: len(c)])
                continue
            rest = model(input_ids=torch.tensor([c[:-1]]), use_cache=True, **{arg: cache}).logits[0]
            cache.crop(-(len(c) - 1))  # a negative count removes that many (old and new transformers)
            out.append(torch.cat([first, rest]))
    return out


def fidelity(groups: dict[str, list[Path]], task: str, sampling, progress: bool = True) -> dict:
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vskip.bench import tasks
    from vskip.engine.models.verifiers import resolve_verifier_dir
    from vskip.files import read_jsonl_lines

    problems = {p.task_id: p for p in tasks.load_task(task)}
    read: dict[str, tuple[int, dict[str, list[list[int]]]]] = {}  # every file read and checked first
    for name, files in groups.items():
        rows = [r for f in files for _, r in read_jsonl_lines(f, given="samples file")]
        if not rows or any(not isinstance(r.get("tokens"), list) for r in rows):
            raise ValueError(f"{name}: every sample needs its output tokens (vskip run's samples files have them)")
        by_task: dict[str, list[list[int]]] = {}
        for r in rows:
            tid = str(r.get("task_id"))
            if tid not in problems:
                raise ValueError(f"{name}: {tid!r} is not a {task} task")
            by_task.setdefault(tid, []).append([int(t) for t in r["tokens"]])
        read[name] = (len(rows), by_task)
    where = resolve_verifier_dir(None)
    tok = AutoTokenizer.from_pretrained(where)
    from vskip.engine.models.source import transformers_dir

    model = AutoModelForCausalLM.from_pretrained(transformers_dir(str(where)), dtype=torch.float32).eval()
    out = {}
    for name, files in groups.items():
        n_rows, by_task = read[name]
        drawn, neg_h, var = [], [], []
        bar = tqdm(total=n_rows, desc=name, disable=not progress)
        for tid, comps in by_task.items():
            prompt = tasks.encode_problem(tok, problems[tid])
            for toks, z in zip(comps, teacher_forced_logits(model, prompt, comps)):
                if toks:
                    a, b, c = scores(z, torch.tensor(toks), sampling)
                    drawn.append(a)
                    neg_h.append(b)
                    var.append(c)
            bar.update(len(comps))
        bar.close()
        d, h, v = np.concatenate(drawn), np.concatenate(neg_h), np.concatenate(var)
        s = d - h  # log p(x) + H(p)
        out[name] = {"files": [str(f) for f in files], "completions": n_rows, "tokens": int(len(d)),
                     "impossible_tokens": int(np.isneginf(d).sum()),
                     "mean_log_p": float(d[np.isfinite(d)].mean()), "mean_neg_entropy": float(h.mean()),
                     "S": float(s[np.isfinite(s)].sum()), "sd_S": float(math.sqrt(v.sum())),
                     "z": float(s[np.isfinite(s)].sum() / math.sqrt(v.sum()))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", nargs="+", action="append", required=True, metavar=("NAME", "FILE"),
                    help="a sampler's name and its samples files (repeat for each sampler)")
    ap.add_argument("--task", required=True)
    ap.add_argument("--temperature", type=float, required=True)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the result here as JSON")
    a = ap.parse_args(argv)
    if any(len(g) < 2 for g in a.files):
        ap.error("--files takes a name and at least one file")
    from vskip.engine.policy import Sampling
    from vskip.files import write_json

    torch.set_num_threads(a.threads)
    s = Sampling(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k)
    try:
        res = fidelity({g[0]: [Path(f) for f in g[1:]] for g in a.files}, a.task, s)
    except (OSError, ValueError) as e:  # a missing or unreadable file, a task id outside the task
        print(f"sampling_fidelity: {e}", file=sys.stderr)
        return 2
    res = {"task": a.task, "sampling": {"temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k},
           "samplers": res}
    if a.out:
        write_json(a.out, res)
    for name, r in res["samplers"].items():
        print(f"{name}: z = {r['z']:+.2f} over {r['tokens']} tokens of {r['completions']} completions "
              f"(mean log p {r['mean_log_p']:.4f}, mean -H {r['mean_neg_entropy']:.4f}, "
              f"impossible {r['impossible_tokens']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
