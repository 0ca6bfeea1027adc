"""Every measured number the design pages (docs/*.md) quote is in a file a command wrote (a report, a summary, a CSV or
JSON under docs/results/<name>/, docs/results/*.json, or the embedded drafter's manifest and copy
prior), to the precision the page gives it (a number the page writes in ms or % may be kept in
seconds or as a share). The exceptions are listed below, each with its reason: numbers that are not
measurements (a version). (The paper's numbers are quoted on checked pages only, annotated there.)

This is the weaker check: it asks only that the number appears somewhere. The README and every
results page name the file and key of each number instead, and tests/test_readme_numbers.py reads
each one there; this file keeps the design pages, which explain more than they report."""

import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
DECIMAL = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.])(\s?(?:ms|%))?")
ANY_NUMBER = re.compile(r"-?\d+\.\d+(?:[eE]-?\d+)?|-?\d+")



#: the embedded drafter's files, whose manifests and copy prior a command wrote with their figures
ASSETS = ROOT / "vskip" / "assets"
WEIGHTS = ASSETS / "smollm2-135m-diffusion" / "drafter.safetensors"
#: numbers of the design pages (docs/*.md) that are not measurements
NOT_MEASURED = {"security.md": {"2.38": "the util-linux version of the machine the sandbox was checked on",
                                "3.13": "the Python version from which frame locals are writable"}}


@lru_cache(maxsize=1)
def _kept() -> frozenset[float]:
    """Every number in a file a command wrote under docs/results (not the written pages themselves)
    or among the embedded drafter's files."""
    found = set()
    for path in [*RESULTS.rglob("*"), *ASSETS.rglob("*.json")]:
        generated = path.parent != RESULTS or path.suffix == ".json"
        if path.is_file() and generated and path.suffix in (".json", ".md", ".csv", ".txt"):
            found |= {abs(float(x)) for x in ANY_NUMBER.findall(path.read_text(errors="ignore"))}
    return frozenset(found)


def _without_size(text: str) -> str:
    """``text`` without the shipped drafter's size in MB, checked against the file instead."""
    size = f"{WEIGHTS.stat().st_size / 1e6:.1f} MB"
    return text.replace(size, "")


@lru_cache(maxsize=None)
def _rounded(decimals: int, scale: int) -> frozenset[float]:
    return frozenset(round(y * scale, decimals) for y in _kept())


def _unkept(text: str) -> set[str]:
    missing = set()
    for x, unit in set(DECIMAL.findall(text)):
        d, v = len(x.split(".")[1]), float(x)
        scale = {"ms": 1000, "%": 100}.get(unit.strip(), 1)
        if v not in _rounded(d, 1) and v not in _rounded(d, scale):
            missing.add(x)
    return missing


DESIGN = sorted(p.name for p in (ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("page", DESIGN)
def test_design_page_numbers_are_kept_in_result_files(page):
    text = _without_size((ROOT / "docs" / page).read_text())
    missing = _unkept(text) - set(NOT_MEASURED.get(page, {}))
    assert not missing, f"docs/{page}: numbers in no result file: {sorted(missing)}"


def test_the_exceptions_are_still_needed():
    """An exception that a page no longer quotes is removed. (Whether a result file holds it by
    coincidence is not checked: a short decimal may turn up in a new file.)"""
    for page, numbers in NOT_MEASURED.items():
        assert set(numbers) <= {x for x, _ in DECIMAL.findall((ROOT / "docs" / page).read_text())}, page


def test_the_check_can_fail():
    assert _unkept("a figure of 9.8713 and one of 0.0001234") == {"9.8713", "0.0001234"}
    # a value kept only in seconds is found when the page writes it in ms, and only then
    ms = next(y for y in sorted(_kept()) if 0.01 < y < 1 and round(y * 1000, 2) not in _rounded(2, 1))
    quoted = f"{y * 1000:.2f}" if (y := ms) else ""
    assert _unkept(f"c_V {quoted} ms") == set() and _unkept(f"c_V {quoted}") == {quoted}
    assert not _unkept("25,351 tokens")  # counts with separators are checked by the reports, not here
