"""The project's scripts under benchmarks/, loaded as modules for the tests that check them (they
are files to run, not a package)."""

import importlib.util
from pathlib import Path


def load_script(name: str):
    """benchmarks/NAME.py as a module."""
    path = Path(__file__).parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
