"""Every number the README quotes names where it comes from, in an annotation right after it that
a reader sees in the source and not in the rendered page:

- ``<!-- src FILE PATH -->``: FILE under docs/results (JSON), PATH the keys and list indices to the
  value, separated by ``/``; the value, rounded to the decimals printed, must equal the number;
- ``<!-- file-size FILE -->``: the size of a shipped file in MB (10^6 bytes), to the decimals printed;
- ``<!-- setting: why -->``: a number that is chosen, not measured (a target, a promise).

Decimals inside code (commands, flags) and section references (§3.2) are not quoted results. A
mutation test changes each quoted digit in turn and checks that the check fails.

The same holds, with the same check, for every region of a results page (docs/results/*.md) between
``<!-- checked -->`` and ``<!-- /checked -->``: the parts of those pages whose every number is
annotated at its source."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
#: a decimal, then an optional unit, then its annotation (or none)
QUOTED = re.compile(r"(?<![\w.§])(\d+\.\d+)(?![\w.])(×|%| MB)?(<!-- (src|file-size|setting)(?::)? ?([^>]*?) -->)?")


def _prose(text: str) -> str:
    """The README without code: fenced blocks and inline code spans become blanks of equal length."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return re.sub(r"`[^`\n]*`", blank, re.sub(r"```.*?```", blank, text, flags=re.S))


def _value(kind: str, arg: str) -> float:
    if kind == "file-size":
        return (ROOT / arg.strip()).stat().st_size / 1e6
    file, path = arg.split(" ", 1)
    x = json.loads((RESULTS / file).read_text())
    for key in path.strip().split("/"):
        x = x[int(key)] if isinstance(x, list) else x[key]
    return float(x)


def problems(text: str) -> list[str]:
    """Every quoted decimal that has no annotation, or whose annotation's value differs."""
    out = []
    for m in QUOTED.finditer(_prose(text)):
        number, kind, arg = m.group(1), m.group(4), m.group(5)
        if kind is None:
            out.append(f"{number}: no source")
        elif kind == "setting":
            if not arg.strip():
                out.append(f"{number}: a setting without its reason")
        else:
            try:
                value = _value(kind, arg)
            except (OSError, KeyError, IndexError, ValueError) as exc:
                out.append(f"{number}: {kind} {arg}: {exc!r}")
                continue
            d = len(number.split(".")[1])
            if round(value, d) != float(number):
                out.append(f"{number}: {kind} {arg} holds {value}")
    return out


def test_every_quoted_number_names_its_source_and_matches_it():
    readme = (ROOT / "README.md").read_text()
    assert not problems(readme)
    assert len(QUOTED.findall(_prose(readme))) >= 15


def _mutations(text: str):
    """The README with one digit of one sourced number changed, for every digit of every number."""
    prose = _prose(text)
    for m in QUOTED.finditer(prose):
        if m.group(4) in ("src", "file-size"):
            for i in range(m.start(1), m.end(1)):
                if text[i].isdigit():
                    yield text[:i] + str((int(text[i]) + 1) % 10) + text[i + 1:]


def test_changing_any_quoted_digit_fails_the_check():
    readme = (ROOT / "README.md").read_text()
    mutants = list(_mutations(readme))
    assert len(mutants) >= 35
    assert all(problems(t) for t in mutants)


@pytest.mark.parametrize("text,why", [
    ("runs at 1.499× the verifier", "no source"),
    ("at 1.499×<!-- src speed/he164/summary.json configs/strict/ratio_ci95/0 -->", "holds"),
    ("at 1.499×<!-- src speed/he164/summary.json configs/nope/ratio_vs_ar -->", "KeyError"),
    ("alpha 0.05<!-- setting: -->", "without its reason"),
])
def test_the_check_names_what_is_wrong(text, why):
    got = problems(text)
    assert len(got) == 1 and why in got[0], got


def test_counts_are_in_committed_results():
    text = _prose((ROOT / "README.md").read_text())
    pages = [p.read_text(errors="ignore") for p in RESULTS.rglob("*.md")]
    for a, b in re.findall(r"\b(\d+)/(\d+)\b", text):  # counts such as 164/164
        assert any(f"{a}/{b}" in p for p in pages), f"{a}/{b}"


CHECKED = re.compile(r"<!-- checked -->(.*?)<!-- /checked -->", re.S)


def _checked_regions() -> list[tuple[str, str]]:
    """(page, text) of every checked region of the results pages."""
    out = []
    for page in sorted(RESULTS.glob("*.md")):
        text = page.read_text()
        assert text.count("<!-- checked -->") == text.count("<!-- /checked -->"), f"{page.name}: unbalanced markers"
        out += [(page.name, m.group(1)) for m in CHECKED.finditer(text)]
    return out


def test_every_number_of_a_checked_region_names_its_source_and_matches_it():
    regions = _checked_regions()
    assert regions, "no results page has a checked region"
    bad = [f"{page}: {p}" for page, text in regions for p in problems(text)]
    assert not bad, bad


def test_changing_any_digit_of_a_checked_region_fails_the_check():
    mutants = [t for _, text in _checked_regions() for t in _mutations(text)]
    assert len(mutants) >= 20
    assert all(problems(t) for t in mutants)

