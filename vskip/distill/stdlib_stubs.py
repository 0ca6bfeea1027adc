"""HumanEval-style stubs (signature, docstring, the imports it needs) of the documented public
functions and methods of pure-Python standard-library modules: the ``stdlib`` training prompts
(:mod:`vskip.distill.prompts` wraps them in the request template)."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import io
import warnings
from contextlib import redirect_stderr, redirect_stdout

#: functions some installed package replaces at import (torch.package swaps ``inspect.getfile``):
#: left out, so that the list is the same whether or not that package was imported first (the
#: committed data set was built with it swapped)
UNSTABLE = frozenset({"inspect.getfile"})

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


def stdlib_stubs() -> list[tuple[str, str]]:
    """(prompt id, stub) of every documented public function and method of :data:`STDLIB_MODULES`,
    in a fixed order."""
    items = []
    for modname in sorted(set(STDLIB_MODULES)):
        module = _import_quietly(modname)
        if module is None:
            continue
        for name, obj in sorted(vars(module).items()):
            if name.startswith("_") or getattr(obj, "__module__", None) != modname or f"{modname}.{name}" in UNSTABLE:
                continue
            if inspect.isfunction(obj):
                stub = _stub(module, obj, None, "function")
                if stub:
                    items.append((f"stdlib/{modname}.{name}", stub))
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
                        items.append((pid, stub))
    return items
