"""Every number the README quotes names where it comes from, in an annotation right after it that
a reader sees in the source and not in the rendered page:

- ``<!-- src FILE PATH -->``: FILE under docs/results (JSON), PATH the keys and list indices to the
  value, separated by ``/`` (a key's own ``/`` written ``~1``, as in JSON Pointer); the value,
  rounded to the decimals printed, must equal the number (with its sign, where it has one);
- ``<!-- src FILE.csv COLUMN=VALUE/NAME -->``: a CSV file a command wrote: the one row whose column
  COLUMN holds VALUE (or several conditions joined by ``&``, ``method=Lenience&pick=fastest``), and
  in it the column NAME (VALUE and NAME may hold ``/``, as in ``tokens/s``: the path splits where a
  column's name follows); ``NAME#i`` is the i-th number of a cell that holds several, such as
  ``1.0729 [0.9217, 1.3804]`` (0 the estimate, 1 and 2 its interval);
- either of those ending in `` ×100``, `` ×1000``, `` ×1e-6`` or `` ×1e-9``: the value scaled, for a
  share printed in %, seconds printed in ms, bytes printed in MB, FLOPs printed in GFLOP;
- ``<!-- file-size FILE -->``: the size of a shipped file in MB (10^6 bytes), to the decimals printed;
- ``<!-- setting: why -->``: a number that is chosen, not measured (a target, a promise);
- ``<!-- paper: where -->``: a number the paper reports (its table or section), quoted beside ours.

Decimals inside code (commands, flags) and section references (§3.2) are not quoted results. A
mutation test changes each quoted digit in turn and checks that the check fails.

The same holds, with the same check, for every region of a results page (docs/results/*.md) between
``<!-- checked -->`` and ``<!-- /checked -->``, and every decimal of a results page's prose is in
such a region. The one other place a
decimal may stand is a verbatim copy of a table a command wrote, between ``<!-- copy FILE -->`` and
``<!-- /copy -->``: the test checks that FILE (under docs/results) holds the copied text as it is."""

import csv
import json
import re
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
#: a decimal (one that ends a sentence too, not a version such as 1.5.2) with its sign where it has
#: one (-0.02, not the hyphen of 0.3-0.5), then an optional unit, then its annotation (or none)
QUOTED = re.compile(r"(?P<sign>(?<![\w.])[-−+])?(?<![\w.§])(?P<number>\d+\.\d+)(?!\w|\.\d)(?P<unit>×|%| MB)?"
                    r"(<!-- (?P<kind>src|file-size|setting|paper)(?::)? ?(?P<arg>.*?) -->)?")
SCALED = re.compile(r"(.*?)(?: ×(100|1000|1e-6|1e-9))?")


def _prose(text: str) -> str:
    """The text without code: fenced blocks and inline code spans become blanks of equal length."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    return re.sub(r"`[^`\n]*`", blank, re.sub(r"```.*?```", blank, text, flags=re.S))


@lru_cache(maxsize=None)
def _read(file: str):
    """A results file's contents: a CSV's rows, a JSON file's value."""
    if file.endswith(".csv"):
        with open(RESULTS / file, newline="") as f:
            return list(csv.DictReader(f))
    return json.loads((RESULTS / file).read_text())


def _value(kind: str, arg: str) -> float:
    if kind == "file-size":
        return (ROOT / arg.strip()).stat().st_size / 1e6
    file, path = arg.split(" ", 1)
    path, scale = SCALED.fullmatch(path.strip()).groups()
    if file.endswith(".csv"):
        table = _read(file)
        # the row's values and the column's name may hold "/" too: the split is where a column follows
        splits = [(path[:i], path[i + 1:]) for i, c in enumerate(path)
                  if c == "/" and path[i + 1:].partition("#")[0] in table[0]]
        if len(splits) != 1:
            raise ValueError(f"{len(splits)} ways to read {path} as ROW/COLUMN")
        where, name = splits[0]
        conditions = [c.split("=", 1) for c in where.split("&")]
        rows = [r for r in table if all(r[c] == v for c, v in conditions)]
        if len(rows) != 1:
            raise ValueError(f"{len(rows)} rows with {where}")
        name, _, index = name.partition("#")
        x = rows[0][name] if not index else re.findall(r"[-+]?\d+\.?\d*", rows[0][name])[int(index)]
    else:
        x = _read(file)
        for key in path.split("/"):
            key = key.replace("~1", "/").replace("~0", "~")  # JSON Pointer's escapes, for keys that hold "/"
            x = x[int(key)] if isinstance(x, list) else x[key]
    return float(x) * float(scale or 1)


def problems(text: str) -> list[str]:
    """Every quoted decimal that has no annotation, or whose annotation's value differs."""
    out = []
    for m in QUOTED.finditer(_prose(text)):
        number, kind, arg = m["number"], m["kind"], m["arg"]
        if kind is None:
            out.append(f"{number}: no source")
        elif kind in ("setting", "paper"):
            if not arg.strip():
                out.append(f"{number}: a {kind} without its reason")
        else:
            try:
                value = _value(kind, arg)
            except (OSError, KeyError, IndexError, ValueError) as exc:
                out.append(f"{number}: {kind} {arg}: {exc!r}")
                continue
            d = len(number.split(".")[1])
            if round(value, d) != float((m["sign"] or "").replace("−", "-") + number):
                out.append(f"{number}: {kind} {arg} holds {value}")
    return out


def test_every_quoted_number_names_its_source_and_matches_it():
    readme = (ROOT / "README.md").read_text()
    assert not problems(readme)
    assert len(QUOTED.findall(_prose(readme))) >= 15


def _mutations(text: str):
    """Every sourced number of ``text``, with its annotation, once for each of its digits changed."""
    prose = _prose(text)
    for m in QUOTED.finditer(prose):
        if m["kind"] in ("src", "file-size"):
            quoted = text[m.start():m.end()]  # the number and its annotation: the check reads no more
            for i in range(m.end("number") - m.start()):
                if quoted[i].isdigit():
                    yield quoted[:i] + str((int(quoted[i]) + 1) % 10) + quoted[i + 1:]


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
    ("tokens/s 13.25<!-- src harness/runs_humaneval_g16.csv config=ar/tokens/s -->", "holds"),
    ("tokens/s 13.24<!-- src harness/runs_humaneval_g16.csv config=nope/tokens/s -->", "0 rows"),
    ("8.2%<!-- src harness/matched_humaneval_g16.csv method=Lenience/call reduction ×100 -->", "2 rows"),
    ("it gives 1.45.", "no source"),
    ("by -0.0427<!-- src full/report/intervals_humaneval_g8.csv config=humaneval/raw_eb0.70_ec0.70_k0_s64/"
     "Δpass@1 [95% CI]#1 -->", "holds"),
    ("share 0.88%<!-- src engine/fp32/summary.json configs/raw+eta_b=0.7+eta_c=0.7+k_min=3/outside_forwards ×100 -->",
     "holds"),
    ("BCE 0.306<!-- paper: -->", "without its reason"),
])
def test_the_check_names_what_is_wrong(text, why):
    got = problems(text)
    assert len(got) == 1 and why in got[0], got


@pytest.mark.parametrize("text", [
    "tokens/s 13.24<!-- src harness/runs_humaneval_g16.csv config=ar/tokens/s -->",
    "at most 0.8%<!-- src engine/fp32/summary.json configs/raw+eta_b=0.7+eta_c=0.7+k_min=3/outside_forwards ×100 -->",
    "BCE 0.306<!-- paper: §5.1 -->",
    "by -0.0427<!-- src full/report/intervals_humaneval_g8.csv config=humaneval/raw_eb0.70_ec0.70_k0_s64/"
    "Δpass@1 [95% CI]#0 -->, 0.3559<!-- src full/report/intervals_humaneval_g8.csv "
    "config=humaneval/raw_eb0.70_ec0.70_k0_s64/rel. calls [95% CI]#0 -->",
    "8.2%<!-- src harness/matched_humaneval_g16.csv method=Lenience&pass@1 vs strict==/call reduction ×100 -->",
])
def test_the_check_reads_every_kind_of_source(text):
    assert not problems(text)


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
    regions = [text for _, text in _checked_regions()]
    sourced = [m for text in regions for m in QUOTED.finditer(_prose(text)) if m["kind"] in ("src", "file-size")]
    assert len(sourced) >= 2100  # the checked pages' sourced numbers: a broken pattern cannot skip them unseen
    mutants = [t for text in regions for t in _mutations(text)]
    assert len(mutants) >= 9000
    assert all(problems(t) for t in mutants)


COPY = re.compile(r"<!-- copy (\S+) -->(.*?)<!-- /copy -->", re.S)


def _unchecked_numbers(text: str) -> list[str]:
    """The decimals of a page's prose outside its checked regions and its verified copies."""
    prose = _prose(text)
    for m in COPY.finditer(prose):
        copied = text[m.start(2):m.end(2)].strip()
        assert copied in (RESULTS / m.group(1)).read_text(), f"not a verbatim copy of {m.group(1)}"
    rest = COPY.sub("", CHECKED.sub("", prose))
    return [m["number"] for m in QUOTED.finditer(rest)]


@pytest.mark.parametrize("page", sorted(p.name for p in RESULTS.glob("*.md")))
def test_every_number_of_a_results_page_is_in_a_checked_region(page):
    left = _unchecked_numbers((RESULTS / page).read_text())
    assert not left, f"{page}: numbers outside a checked region: {left}"


def test_the_coverage_check_can_fail():
    assert _unchecked_numbers("<!-- checked -->at 1.5<!-- src a b --><!-- /checked --> and 2.5") == ["2.5"]
    copy = "<!-- copy engine/fp32/summary.md -->\n- strict: {}, 0.737, 0.654\n<!-- /copy -->"
    assert _unchecked_numbers("`2.5` and " + copy.format("0.726")) == []
    with pytest.raises(AssertionError, match="verbatim"):
        _unchecked_numbers(copy.format("0.727"))
