"""The layout stays readable: no function in vskip/ over 80 lines, no module over 500, no import
cycle between vskip's modules (counting the imports made inside functions and in ``__main__``
blocks: a script entry point that imports the command line is a cycle too), and no private name
imported from another package."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "vskip"
MAX_FUNCTION, MAX_MODULE = 80, 500


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return out


def _target(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    if node.level:
        base = package[: len(package) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def _imports(name: str, path: Path, tree: ast.Module, known: set[str]) -> set[str]:
    """The vskip modules ``name`` imports anywhere in its body, ``__main__`` blocks included (a
    name imported from a package counts as that submodule when it is one)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _target(name, path, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m in known and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_function_is_longer_than_80_lines():
    long = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
            for path, tree in _modules().values() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION]
    assert not long, long


def test_no_module_is_longer_than_500_lines():
    big = [f"{path.relative_to(PACKAGE.parent)} ({n})" for path, _ in _modules().values()
           if (n := path.read_text(encoding="utf-8").count("\n")) > MAX_MODULE]
    assert not big, big


def test_no_import_cycle():
    mods = _modules()
    graph = {name: _imports(name, path, tree, set(mods)) for name, (path, tree) in mods.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_sees_a_cycle_hidden_inside_a_function():
    a = ast.parse("def f():\n    from . import b\n")
    b = ast.parse("from .a import x\n")
    known = {"pkg.a", "pkg.b"}
    graph = {"pkg.a": _imports("pkg.a", Path("a.py"), a, known), "pkg.b": _imports("pkg.b", Path("b.py"), b, known)}
    assert _cycles(graph) == [["pkg.a", "pkg.b"]]


def test_the_library_does_not_import_the_command_line():
    mods = _modules()
    for name, (path, tree) in mods.items():
        if name.startswith(("vskip.commands", "vskip.cli", "vskip.__main__")):
            continue
        bad = {m for m in _imports(name, path, tree, set(mods)) if m.startswith(("vskip.commands", "vskip.cli"))}
        assert not bad, (name, bad)


def _package(module: str) -> str:
    """The package a module belongs to: itself for a package, else its parent (``vskip`` for the
    modules at the root)."""
    parts = module.split(".")
    return module if PACKAGE.parent.joinpath(*parts).is_dir() else ".".join(parts[:-1])


def test_no_private_name_is_imported_from_another_package():
    mods = _modules()
    found = []
    for name, (path, tree) in mods.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (target := _target(name, path, node)).startswith("vskip"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and _package(target) != _package(name):
                    found.append(f"{name} <- {target}: {', '.join(private)}")
    assert not found, found


def test_packages_are_told_apart():
    assert _package("vskip.engine.models.load") == "vskip.engine.models" and _package("vskip.study.runner") == "vskip.study"
    assert _package("vskip.commands") == "vskip.commands" and _package("vskip.files") == "vskip"


def test_only_the_environment_module_touches_the_process_environment():
    """vskip.environment reads every variable vskip knows; no other module reads or writes
    ``os.environ`` or calls ``os.getenv`` (the sandbox builds its programs' environments apart)."""
    found = []
    for name, (path, tree) in _modules().items():
        if name == "vskip.environment":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                found.append(f"{name}:{node.lineno}")
    assert not found, found


#: The floors of the layout (docs/architecture.md): a module may import its own floor's and the
#: floors below, never one above. The root modules are the ground floor.
FLOORS = {"defaults": 0, "environment": 0, "files": 0, "stats": 0, "engine": 1, "bench": 2, "study": 3,
          "distill": 3, "report": 4, "serve": 4, "commands": 5, "cli": 6, "__main__": 7}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None


def test_every_module_has_a_floor_and_no_import_goes_up():
    mods = _modules()
    unplaced = [m for m in mods if m != "vskip" and _floor(m) is None]
    assert not unplaced, f"give these a floor in FLOORS: {unplaced}"
    up = [f"{name} -> {m}" for name, (path, tree) in mods.items() if name != "vskip"
          for m in _imports(name, path, tree, set(mods)) if m != "vskip" and _floor(m) > _floor(name)]
    assert not up, up


def test_the_floor_check_sees_an_arrow_up():
    tree = ast.parse("def f():\n    from ..study.runner import run\n")
    found = _imports("vskip.engine.decode", PACKAGE / "engine" / "decode.py", tree, {"vskip.study.runner"})
    assert found == {"vskip.study.runner"} and _floor("vskip.study.runner") > _floor("vskip.engine.decode")


def test_every_package_says_what_it_owns():
    missing = [name for name, (path, tree) in _modules().items()
               if path.name == "__init__.py" and not (ast.get_docstring(tree) or "").strip()]
    assert not missing, missing



def _main_blocks(tree: ast.Module) -> int:
    """``if __name__ == "__main__":`` blocks at a module's top level."""
    def is_main(test) -> bool:
        return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))

    return sum(isinstance(node, ast.If) and is_main(node.test) for node in tree.body)


def test_only_the_entry_points_run_as_scripts():
    """One way in: the command line (``vskip``, ``python -m vskip``). A library module with a
    ``__main__`` block of its own is a second entry point that the layout does not show."""
    blocks = {name: _main_blocks(tree) for name, (_, tree) in _modules().items()}
    assert {name for name, n in blocks.items() if n} == {"vskip.cli"}, blocks
    assert _main_blocks(ast.parse('import sys\nif __name__ == "__main__":\n    sys.exit(0)\n')) == 1
