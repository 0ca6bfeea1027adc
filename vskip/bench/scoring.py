"""Scoring completions: code by execution in the sandbox, maths by normalised exact match.

Code tasks (HumanEval, MBPP, MBPP+): the program runs the extracted solution, then the tests, and
a random per-run nonce sent on stdin is written back only when the tests returned
(:mod:`vskip.bench.sandbox.verdict`). A completion passes when the program exits with status 0 *and*
the nonce appears on stdout, so a solution that exits early (``sys.exit(0)``, ``os._exit(0)``),
or turns a failed test into exit status 0 (``sys.excepthook``, ``atexit``), does not pass.

Maths (MATH-500, GSM8K): the answer is the last ``\\boxed{...}`` (or the last number), compared
with the reference after :func:`normalize_answer` by exact string equality (no symbolic
equivalence).

Nothing here imports torch.
"""

from __future__ import annotations

import re
import secrets
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vskip.bench.sandbox import run_program, sandbox_kind, verdict
from vskip.bench.tasks import ALL_TASKS, Problem, last_boxed, load_task
from vskip.engine.metrics import pass_at_k_paired, pass_at_k_table
from vskip.environment import sandbox_preference
from vskip.files import read_json, read_jsonl_lines
from vskip.stats import resample_indices

__all__ = [
    "ScoreResult",
    "BootstrapResult",
    "extract_code",
    "extract_answer",
    "normalize_answer",
    "build_program",
    "score",
    "score_many",
    "score_samples_file",
    "paired_bootstrap",
    "CODE_TASKS",
    "MATH_TASKS",
]

CODE_TASKS = ("humaneval", "mbpp", "mbpp_plus")
MATH_TASKS = ("math500", "gsm8k")


@dataclass(frozen=True)
class ScoreResult:
    task_id: str
    passed: bool
    status: str  # passed | failed | timeout | error (code); passed | failed (maths)
    detail: str


@dataclass(frozen=True)
class BootstrapResult:
    diff: float
    lo: float
    hi: float


# ----------------------------------------------------------------------------- code


_DEFINES = re.compile(r"^[ \t]*(?:async[ \t]+def|def|class)[ \t]+\w+", re.M)
_PY_LANGS = {"", "python", "py", "python3", "py3"}


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each ``` block; an unclosed last block runs to the end."""
    blocks = []
    lang = None
    body: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if lang is None:
            if stripped.startswith("```"):
                lang = stripped[3:].strip().split()[0].lower() if stripped[3:].strip() else ""
                body = []
        elif stripped.startswith("```"):
            blocks.append((lang, "\n".join(body)))
            lang = None
        else:
            body.append(line)
    if lang is not None:
        blocks.append((lang, "\n".join(body)))
    return blocks


def extract_code(completion: str) -> str:
    """The first ```python (or bare ```) block that defines something (def/class); else the
    raw completion."""
    for lang, body in _fenced_blocks(completion):
        if lang in _PY_LANGS and _DEFINES.search(body):
            return body
    return completion


def _defines_top_level(code: str, name: str) -> bool:
    pattern = rf"^(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\("
    return re.search(pattern, code, re.M) is not None


def _prompt_imports(prompt: str) -> str:
    """The top-level import lines of a benchmark prompt, as a block to put before a solution."""
    lines = [ln for ln in prompt.splitlines() if re.match(r"^(?:import|from)\s+\w", ln)]
    return "\n".join(lines) + "\n\n" if lines else ""


_FUTURE = re.compile(r"^from[ \t]+__future__[ \t]+import[^\n]*\n?", re.M)


def build_program(problem: Problem, completion: str) -> str:
    """The program that checks ``completion``: the solution, then the tests, under the guard of
    :mod:`vskip.bench.sandbox.verdict` (which writes the nonce it reads on stdin only when the tests
    returned)."""
    if problem.task not in CODE_TASKS:
        raise ValueError(f"{problem.task} is not a code task")
    if problem.test is None:
        raise ValueError(f"{problem.task_id} has no test code")
    code = extract_code(completion)
    helpers = ""
    if problem.task == "humaneval":
        helpers = problem.prompt  # the prompt's own helpers (poly, encode_cyclic), run apart for the tests
        if problem.entry_point and _defines_top_level(code, problem.entry_point):
            # The full function was rewritten: keep the prompt's own imports (``from typing
            # import List`` ...), which a model often drops when it restates the function.
            solution = _prompt_imports(problem.prompt) + code
        else:
            # A continuation of the prompt, as the official harness assembles it.
            solution = problem.prompt + completion
        tests = f"{problem.test}\n\ncheck({problem.entry_point})\n"
    else:
        solution = code
        tests = problem.test
    # __future__ imports must come first in a module: hoist them above the prompt's imports
    future = "".join(m.group(0).rstrip("\n") + "\n" for m in _FUTURE.finditer(solution))
    return verdict.build(future + _FUTURE.sub("", solution), tests, problem.entry_point, helpers)


def _last_line(text: str, limit: int = 300) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


def _score_code(problem: Problem, completion: str, timeout: float) -> ScoreResult:
    nonce = f"VSKIP-DONE-{secrets.token_hex(16)}"
    res = run_program(build_program(problem, completion), timeout=timeout, stdin=(nonce + "\n").encode(),
                      isolation=sandbox_preference())
    nonce_seen = nonce in res.stdout_tail.splitlines()
    passed = res.status == "passed" and nonce_seen
    if passed:
        return ScoreResult(problem.task_id, True, "passed", f"sandbox={res.kind}")
    status = res.status
    if status == "passed":  # exit 0 without reaching the end of the tests
        status = "failed"
        detail = "the program exited before the tests finished"
    elif status == "timeout":
        detail = res.note or "timeout"
    else:
        detail = _last_line(res.stderr_tail) or res.note or f"exit status {res.returncode}"
        if res.note and res.note not in detail:
            detail = f"{detail} ({res.note})"
    return ScoreResult(problem.task_id, False, status, detail)


# ----------------------------------------------------------------------------- maths

_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")


def extract_answer(text: str) -> str | None:
    """The last balanced ``\\boxed{...}``/``\\fbox{...}``, else the last signed integer or
    decimal in the text, else None."""
    if text is None:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    nums = _NUMBER.findall(text)
    return nums[-1] if nums else None


_WRAPPERS = ("text", "textbf", "textit", "textrm", "textnormal", "textup", "mathrm", "mbox",
             "operatorname")
_UNITS = (
    r"(?:(?:square|sq\.?|cubic)\s+)?(?:units?|cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot|ft|"
    r"yards?|miles?|degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|weeks?|months?|"
    r"years?|pounds?|ounces?|mph|percent)"
)
_UNIT_TAIL = re.compile(rf"^(.*?[\d}}])\s*{_UNITS}\.?(?:\s*\^\s*\{{?[23]\}}?)?\s*$", re.S)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[-+]?\.\d+")


def _unwrap(s: str, names) -> str:
    """Replace ``\\name{X}`` by X (balanced braces) for each command name."""
    pattern = re.compile(r"\\(?:%s)\s*\{" % "|".join(names))
    while True:
        m = pattern.search(s)
        if not m:
            return s
        depth, j = 0, m.end() - 1
        for j in range(m.end() - 1, len(s)):
            if s[j] == "{":
                depth += 1
            elif s[j] == "}":
                depth -= 1
                if depth == 0:
                    break
        else:
            return s[: m.start()] + s[m.end():]  # unbalanced: drop the command only
        s = s[: m.start()] + s[m.end(): j] + s[j + 1:]


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{2} -> \frac{1}{2}, \frac{1}2 -> \frac{1}{2}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac(\{[^{}]*\})(\d)", r"\\frac\1{\2}", s)
    return s


def _fix_sqrt(s: str) -> str:
    # \sqrt2 -> \sqrt{2}, \sqrt x -> \sqrt{x}
    return re.sub(r"\\sqrt(\d+|[A-Za-z])", r"\\sqrt{\1}", s)


def _format_number(s: str) -> str:
    if not _PLAIN_NUMBER.fullmatch(s):
        return s
    sign = ""
    if s[0] in "+-":
        sign, s = ("-" if s[0] == "-" else ""), s[1:]
    s = s.replace(",", "")
    if "." in s:
        whole, frac = s.split(".", 1)
        frac = frac.rstrip("0")
        whole = whole.lstrip("0") or "0"
        s = whole + ("." + frac if frac else "")
    else:
        s = s.lstrip("0") or "0"
    if s == "0":
        sign = ""
    return sign + s


def normalize_answer(s: str | None) -> str:
    """A canonical string for exact comparison of maths answers.

    Strips LaTeX wrappers (``\\text{}``, ``\\mathrm{}``, ``\\mbox{}``, ``\\left``/``\\right``,
    ``$``, ``\\!``, ``\\,``, ``^\\circ``/degrees, ``\\displaystyle``), maps ``\\dfrac``/``\\tfrac``
    to ``\\frac`` and adds the braces of ``\\frac12``/``\\sqrt2``, drops currency (``\\$``,
    dollars), percent (``\\%``, ``%``) and a trailing unit word after a number, a leading
    ``x =``, a trailing period and all spacing, and canonicalises plain numbers (thousands
    commas ``1,000`` -> ``1000``, trailing zeros ``2.50`` -> ``2.5``, a leading ``+``).
    """
    if s is None:
        return ""
    s = str(s).strip()
    if re.match(r"\\(?:boxed|fbox)\b", s):
        inner = last_boxed(s)
        if inner is not None:
            s = inner
    s = s.replace("\n", " ")
    s = s.replace("\\$", " ").replace("$", " ")
    s = _unwrap(s, _WRAPPERS)
    s = re.sub(r"\\(?:left|right)(?![A-Za-z])", "", s)
    s = re.sub(r"\\(?:displaystyle|textstyle)(?![A-Za-z])", "", s)
    s = re.sub(r"\\[!,;:]", "", s)
    s = re.sub(r"(?<!\\)\\ ", " ", s)
    s = re.sub(r"\\q?quad(?![A-Za-z])", " ", s)
    s = re.sub(r"\\[dt]frac(?![A-Za-z])", r"\\frac", s)
    s = re.sub(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])", "", s)
    s = re.sub(r"\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace("{,}", ",")
    s = s.strip()
    m = _UNIT_TAIL.match(s)
    if m and not re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", m.group(1))):
        s = m.group(1)
    s = re.sub(r"\s+", "", s)
    s = _fix_sqrt(_fix_fracs(s))
    m = re.fullmatch(r"[A-Za-z]=(.+)", s)
    if m and "=" not in m.group(1):
        s = m.group(1)
    s = s.rstrip(".")
    return _format_number(s)


def _score_math(problem: Problem, completion: str) -> ScoreResult:
    if problem.reference is None:
        raise ValueError(f"{problem.task_id} has no reference answer")
    pred = extract_answer(completion)
    if pred is None:
        return ScoreResult(problem.task_id, False, "failed", "no answer found")
    a, b = normalize_answer(pred), normalize_answer(problem.reference)
    passed = a != "" and a == b
    detail = f"answer {a!r} vs reference {b!r}"
    return ScoreResult(problem.task_id, passed, "passed" if passed else "failed", detail)


# ----------------------------------------------------------------------------- entry points


def score(problem: Problem, completion: str, timeout: float = 10.0) -> ScoreResult:
    """Score one completion of ``problem``."""
    if not isinstance(completion, str):
        raise TypeError("a completion must be a string")
    if problem.task in CODE_TASKS:
        return _score_code(problem, completion, timeout)
    if problem.task in MATH_TASKS:
        return _score_math(problem, completion)
    raise ValueError(f"unknown task {problem.task!r}; valid tasks: {', '.join(ALL_TASKS)}")


def score_many(
    problems: Sequence[Problem],
    completions: Sequence[str],
    workers: int = 2,
    progress: bool = True,
    timeout: float = 10.0,
) -> list[ScoreResult]:
    """Score ``completions[i]`` against ``problems[i]``, ``workers`` programs at a time (each
    runs in its own sandboxed subprocess, so threads suffice). Results keep the input order."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    if workers < 1:
        raise ValueError("workers must be at least 1")
    from tqdm import tqdm

    results: list[ScoreResult | None] = [None] * len(problems)
    with tqdm(total=len(problems), desc="scoring", disable=not progress, leave=False) as bar:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(score, p, c, timeout): i
                       for i, (p, c) in enumerate(zip(problems, completions))}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                bar.update(1)
    return results  # type: ignore[return-value]


def score_samples_file(
    task: str,
    path,
    problems: Sequence[Problem] | None = None,
    timeout: float = 10.0,
    workers: int = 2,
    progress: bool = False,
) -> dict:
    """Score an EvalPlus-style JSONL samples file (``task_id`` plus ``completion`` or
    ``solution`` per line; several samples per task are allowed), or the union of several (``path``
    a list: the parts of one run, each a ``.jsonl`` or ``.jsonl.gz``).

    Returns ``{"task", "n", "passed", "n_tasks", "pass_at_1", "pass_at_k", "sandbox", "results"}``
    where ``passed`` counts the samples that passed and pass@1 is the mean over tasks of each task's
    pass rate; with ``"decode"`` where every sample is
    one vskip decoded (:func:`decode_totals`). ``problems`` (e.g. from
    :func:`vskip.bench.mbpp_plus.load_mbpp_plus_file`) replaces the bundled data of ``task``.
    """
    if task not in ALL_TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(ALL_TASKS)}")
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    if not paths:
        raise ValueError("no samples file given")
    seen: dict[Path, Path] = {}
    for p in paths:  # one file twice would count its samples twice
        if p.resolve() in seen:
            raise ValueError(f"samples file {p} is given twice (as {seen[p.resolve()]})")
        seen[p.resolve()] = p
    samples, recs = [], []
    for path in paths:
        for n, rec in read_jsonl_lines(path, given="samples file"):
            if "task_id" not in rec:
                raise ValueError(f"{path} line {n}: a sample needs a task_id")
            body = rec.get("completion", rec.get("solution"))
            if not isinstance(body, str):
                raise ValueError(f"{path} line {n}: a sample needs a string completion or solution")
            samples.append((str(rec["task_id"]), body))
            recs.append(rec)
    path = paths[0] if len(paths) == 1 else f"{paths[0]} (+{len(paths) - 1} more)"
    if not samples:
        raise ValueError(f"{path}: no samples")
    numbered = Counter((str(r["task_id"]), r["sample"]) for r in recs if "sample" in r)
    dup = next((k for k, c in numbered.items() if c > 1), None)  # --samples-per-prompt numbers a prompt's completions
    if dup is not None:
        raise ValueError(f"{path}: completion {dup[1]} of {dup[0]} appears twice")
    pool = list(problems) if problems is not None else load_task(task)
    by_id = {p.task_id: p for p in pool}
    unknown = sorted({tid for tid, _ in samples if tid not in by_id})
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10
                                           else "")
        raise ValueError(f"{path}: unknown {task} task ids: {shown}")
    results = score_many([by_id[t] for t, _ in samples], [b for _, b in samples],
                         workers=workers, progress=progress, timeout=timeout)
    per_task: dict[str, list[bool]] = {}
    for r in results:
        per_task.setdefault(r.task_id, []).append(r.passed)
    pass1 = float(np.mean([np.mean(v) for v in per_task.values()]))
    return {
        "task": task,
        "n": len(results),
        "passed": sum(r.passed for r in results),
        "n_tasks": len(per_task),
        "pass_at_1": pass1,
        "pass_at_k": pass_at_k_table(per_task),
        "sandbox": sandbox_kind(sandbox_preference()) if task in CODE_TASKS else None,
        "results": [asdict(r) for r in results],
        **({"decode": decode} if (decode := decode_totals(recs)) else {}),
    }


_DECODE_KEYS = ("n_samples", "generated_tokens", "decode_seconds", "tokens_per_s", "verifier_calls",
                "calls_per_token", "draft_blocks", "blocks_per_token", "skipped_rounds", "machines")


def decode_totals(samples: Sequence[dict]) -> dict | None:
    """What vskip's samples say of their decode, summed over them (:func:`vskip.engine.metrics.summarize`
    without the rounds): tokens, seconds and calls with their ratios (tokens per second is per
    sequence: in a batch each completion's clock runs while the others decode), and the machines
    the clocks were read on. None unless every sample carries its decode's counts (an EvalPlus file does not)."""
    from vskip.engine.metrics import summarize

    need = ("generated_tokens", "decode_seconds", "verifier_calls", "draft_blocks")
    if not samples or not all(all(isinstance(s.get(k), (int, float)) for k in need) for s in samples):
        return None
    s = summarize(samples, [])
    per_call = s["generated_tokens"] / s["verifier_calls"] if s["verifier_calls"] else None
    return {k: s[k] for k in _DECODE_KEYS if k in s} | {"n_samples": len(samples), "tokens_per_call": per_call}


def read_score_file(path) -> dict:
    """A score file of ``vskip score --out`` (its per-sample ``results``), for :func:`paired_with`."""
    theirs = read_json(path, "score file")
    if not isinstance(theirs, dict) or not isinstance(theirs.get("results"), list):
        raise ValueError(f"{path}: not a score file of vskip score --out (no results)")
    for i, r in enumerate(theirs["results"]):
        if not isinstance(r, dict) or "task_id" not in r or not isinstance(r.get("passed"), bool):
            raise ValueError(f"{path}: result {i} has no task_id and passed")
    return theirs


def paired_with(res: dict, theirs: dict, name: str) -> dict:
    """pass@k of a :func:`score_samples_file` result minus that of another score file ``theirs``
    (:func:`read_score_file`; ``name`` says where it came from), paired by task
    (:func:`vskip.engine.metrics.pass_at_k_paired`)."""
    if theirs.get("task") != res["task"]:
        raise ValueError(f"{name} scores {theirs.get('task')!r}, these samples answer {res['task']!r}")

    def by_task(results) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for r in results:
            out.setdefault(str(r["task_id"]), []).append(r["passed"])
        return out

    return {"other": name, "pass_at_k": pass_at_k_paired(by_task(res["results"]), by_task(theirs["results"]))}


# ----------------------------------------------------------------------------- statistics


def paired_bootstrap(
    a: Sequence[bool],
    b: Sequence[bool],
    n_resamples: int = 10_000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapResult:
    """pass@1(b) - pass@1(a) on the same tasks, with a paired percentile bootstrap interval."""
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.ndim != 1 or y.ndim != 1 or len(x) != len(y):
        raise ValueError(f"a and b must be paired 1-d sequences (lengths {x.size} and {y.size})")
    if len(x) == 0:
        raise ValueError("a and b are empty")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    if n_resamples < 1:
        raise ValueError("n_resamples must be at least 1")
    d = y - x
    means, start = np.empty(n_resamples), 0
    for idx in resample_indices(len(d), n_resamples, seed, max_elements=1 << 22):
        means[start:start + len(idx)] = d[idx].mean(axis=1)
        start += len(idx)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(means, [alpha, 1.0 - alpha])
    return BootstrapResult(float(d.mean()), float(lo), float(hi))
