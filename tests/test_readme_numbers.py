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
- either of those ending in `` ×100``, `` ×1000``, `` ×1e6``, `` ×1e-6`` or `` ×1e-9``: the value scaled,
  for a share printed in %, seconds printed in ms, a small probability printed in millionths
  (``1.8 × 10⁻⁶``), bytes printed in MB, FLOPs printed in GFLOP;
- ``<!-- file-size FILE -->``: the size of a shipped file in MB (10^6 bytes), to the decimals printed;
- ``<!-- setting: why -->``: a number that is chosen, not measured (a target, a promise);
- ``<!-- paper: where -->``: a number the paper reports, quoted beside ours; ``where`` names its
  places (§5.2, §A.5, Table 1, Figure 4, abstract), and where ``../shared/paper.md`` is beside this
  repository the number must be in the paper's text at each of them (without the paper that test
  is skipped, and says so).

A whole number followed by an annotation (146, 5,086) is checked like a decimal. Decimals inside
code (commands, flags) and section references (§3.2) are not quoted results. A mutation test
changes each quoted digit in turn (decimals, whole numbers, the paper's values) and checks that
the check fails.

Counts (a whole number with separators, a fraction of counts such as 39/34 or 68 of 164, a whole
number before what it counts, as in 73 test prompts) are annotated, or stated as settings once on
their page with what they count (``<!-- settings: 164 prompts; 512 new tokens -->``); the few
that no committed file holds are listed in ``UNSOURCED`` with why.

Every speed figure (a sourced tokens/s, a ratio of them, a cost in ms or s) has in its section a
line naming the machine of its runs, ``...<!-- machine DIR -->``: it must name the CPU model and
every vector extension the runs under DIR recorded (and no other, for one machine), or say "not
recorded" where they recorded none. A section that sets speeds of several machines side by side
says so, ``<!-- machines differ: why -->``.

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
#: a decimal (one that ends a sentence too, not a version such as 1.5.2), or a whole number (5,086
#: with its separators) that has an annotation, with its sign where it has one (-0.02, not the
#: hyphen of 0.3-0.5), then an optional unit, then its annotation (or none: a decimal only)
KINDS = r"(?:src|file-size|setting|paper)"
QUOTED = re.compile(r"(?P<sign>(?<![\w.])[-−+])?(?<![\w.§])"
                    r"(?P<number>\d+\.\d+(?!\w|\.\d)|(?<!,)(?:\d{1,3}(?:,\d{3})+|\d+)(?![\w.,]|\.\d)"
                    r"(?=(?:×|%| MB)?<!-- " + KINDS + "))"
                    r"(?P<unit>×|%| MB)?"
                    r"(<!-- (?P<kind>" + KINDS + r")(?::)? ?(?P<arg>.*?) -->)?")
SCALED = re.compile(r"(.*?)(?: ×(100|1000|1e6|1e-6|1e-9))?")


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


#: the paper, beside this repository as CI has it (``../shared/paper.md``)
PAPER = ROOT.parent / "shared" / "paper.md"
#: a place in the paper: a section (§5.2, §A.7), a table or figure, the abstract
PLACE = re.compile(r"§\s?(?P<section>(?:\d+|A)(?:\.\d+)*)|\b(?P<float>Table|Figure) (?P<n>\d+)\b"
                   r"|\b(?P<abstract>abstract)\b", re.I)


def problems(text: str) -> list[str]:
    """Every quoted decimal that has no annotation, every quoted number whose annotation's value
    differs, and every paper value that names no place in the paper (the paper's text itself is
    read by :func:`paper_problems`)."""
    out = []
    for m in QUOTED.finditer(_prose(text)):
        number, kind, arg = m["number"], m["kind"], m["arg"]
        if kind is None:
            out.append(f"{number}: no source")
        elif kind in ("setting", "paper"):
            if not arg.strip():
                out.append(f"{number}: a {kind} without its reason")
            elif kind == "paper" and not PLACE.search(arg):
                out.append(f"{number}: a paper value naming no place in the paper (§, Table, Figure, abstract)")
        else:
            try:
                value = _value(kind, arg)
            except (OSError, KeyError, IndexError, ValueError) as exc:
                out.append(f"{number}: {kind} {arg}: {exc!r}")
                continue
            d = len(number.split(".")[1]) if "." in number else 0
            if round(value, d) != float((m["sign"] or "").replace("−", "-") + number.replace(",", "")):
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


#: what a whole number before it counts (73 test prompts, 192 random anchors, 5,086 blocks)
NOUNS = ("prompt", "block", "anchor", "token", "round", "call", "seed", "sample", "problem", "answer", "task",
         "step", "row", "completion", "output", "point", "configuration", "run", "position", "sequence", "shard",
         "fold", "layer", "decode", "repeat", "resample", "item", "bin", "draw", "skip", "unit", "file", "label")
_WHOLE = r"\d{1,3}(?:,\d{3})+|\d+"
#: a count a page may quote: a whole number with separators (5,086), a fraction of counts (39/34,
#: 8/164, 68 of 164), or a whole number before what it counts, at most two words apart; ``\x01`` marks where
#: an annotation stood (:func:`_counting_text`)
COUNT = re.compile(rf"(?<![\w./§#=+\x01-])(?<!\d,)(?P<a>{_WHOLE})(?P<ann_a>\x01)?"
                   rf"(?:(?:/| of )(?P<b>{_WHOLE})(?P<ann_b>\x01)?)?"
                   rf"(?![\w/]|[.,]\d)(?:\s+(?:[\w+-]+\s+){{0,2}}?(?P<noun>{'|'.join(NOUNS)})(?:s|es)?\b)?")
#: what a parameter's value or a label stands after (gamma 8, k_min 3, rotation 0, Table 4)
PARAMETER = re.compile(r"(?:\b(?:k_min|K_min|gamma|gamma_max|s_max|min_match|top-k|rotation|[Rr]ound|fold|seed"
                       r"|Table|Figure|Eq\.|Eqs\.|alpha|step|layer|K|L|j|r|n|k|P)|[=≥≤<>+])\s?$")
#: a page's whole numbers that are settings, with what they count: ``<!-- settings: 164 prompts;
#: 512 new tokens -->`` (a count of the same number and kind is then a setting wherever it stands)
SETTINGS = re.compile(r"<!-- settings: (.*?) -->", re.S)


def _counting_text(text: str) -> str:
    """The prose with each number's annotation (src, setting, paper, file-size) as ``\x01`` and
    every other comment blanked, so that no count is read inside one."""
    prose = _prose(text)
    prose = re.sub(r"<!-- " + KINDS + r"\b.*?-->", "\x01", prose)
    return re.sub(r"<!--.*?-->", " ", prose, flags=re.S)


def _declared(text: str) -> set[tuple[int, str | None]]:
    """The settings a page declares: (number, what it counts) and (number, None)."""
    out = set()
    for m in SETTINGS.finditer(text):
        for x in COUNT.finditer(m.group(1)):
            n = int(x["a"].replace(",", ""))
            out |= {(n, x["noun"]), (n, None)}
    return out


def count_problems(text: str, declared: set | None = None) -> list[str]:
    """Every count of ``text`` neither annotated (its source, or why it is a setting) nor among the
    page's declared settings (``declared``; those of ``text`` itself when not given)."""
    declared = _declared(text) if declared is None else declared
    out = []
    counting = _counting_text(text)
    for m in COUNT.finditer(counting):
        if not (m["b"] or m["noun"] or "," in m["a"]):
            continue  # a bare small number: a label, a setting, an index
        if PARAMETER.search(counting[max(0, m.start() - 12):m.start()]):
            continue  # a parameter's value (k_min 3 skips), a label (Table 4), not a count
        noun = m["noun"]
        for part, ann in (("a", "ann_a"), ("b", "ann_b")):
            if m[part] is None or m[ann]:
                continue
            n = int(m[part].replace(",", ""))
            if part == "a" and m["b"]:  # what was counted out of the whole: a setting only as one of its kind
                if noun is None or (n, noun) not in declared:
                    out.append(f"{m.group(0).strip()!r}: {m[part]} names no source")
            elif (n, noun if part == "a" else None) not in declared:
                out.append(f"{m.group(0).strip()!r}: {m[part]} names no source and is no declared setting")
    return out


#: counts no committed file holds, each with why (the count as the page writes it, its page)
UNSOURCED = {
    "README.md": {"8 of 12 points": "counted over the rows of four report tables (full.md, H1)"},
    "harness.md": {"5 of 40": "pass@1 0.125 of the 40 prompts; the count itself is in no file",
                   "5 prompts": "the same count, pass@1 0.125 of 40"},
    "predictors.md": {"1,756 rounds": "Strict SDD's rounds in the harness runs, which are not committed"},
    "drafter.md": {"164/164": "bench_drafter's lossless check of runs that are not committed",
                   "8/164 for every configuration": "pass@1 of runs that are not committed",
                   "10/164": "pass@1 of runs that are not committed",
                   "10,671 blocks": "the blocks of runs that are not committed (results.json keeps their histogram)",
                   "70,438 answer": "shard 0 as it was then; the data set was generated again since"},
    "drafter-conditioned.md": {"284 tokens": "the recorded tokens over the recorded seconds, both quoted beside it"},
    "drafter-v2.md": {"164/164": "r1's lossless check, in runs that are not committed (drafter.md)"},
    "scheduler.md": {"10 of 164": "Strict SDD's pass@1 rate times its prompts; the report keeps the rate",
                     "8 of 200": "Strict SDD's pass@1 rate times its prompts; the report keeps the rate",
                     "4/164": "a pass@1 rate times the prompts; the report keeps the rate",
                     "10/164": "a pass@1 rate times the prompts; the report keeps the rate",
                     "6/164": "a pass@1 rate times the prompts; the report keeps the rate",
                     "10 blocks": "the blocks of the bins between those named, summed"},
    "full.md": {"10/164": "Strict SDD's pass@1 rate times its prompts; the traces' summary keeps the rate",
                "8/200": "Strict SDD's pass@1 rate times its prompts; the traces' summary keeps the rate",
                "10 of 164": "Strict SDD's pass@1 rate times its prompts; the traces' summary keeps the rate",
                "8 of 200": "Strict SDD's pass@1 rate times its prompts; the traces' summary keeps the rate",
                "13 of 21": "outputs that reach the token budget, counted in the committed rows; no file keeps it",
                "14 of 25": "outputs that reach the token budget, counted in the committed rows; no file keeps it",
                "10 blocks": "the blocks of the bins between those named, summed"},
    "sampling.md": {"2/20": "pass@1 0.1 of 20 prompts; the run's summary keeps the rate, not the count",
                    "0/20": "pass@1 0.0 of 20 prompts; the run's summary keeps the rate, not the count"},
}


def _count_regions() -> list[tuple[str, str, set]]:
    """(page, text, its declared settings) of the README and every checked region."""
    readme = (ROOT / "README.md").read_text()
    out = [("README.md", readme, _declared(readme))]
    for page in sorted(RESULTS.glob("*.md")):
        text = page.read_text()
        out += [(page.name, m.group(1), _declared(text)) for m in CHECKED.finditer(text)]
    return out


def _unsourced(page: str, problem: str) -> bool:
    return any(snippet in problem for snippet in UNSOURCED.get(page, {}))


def test_every_count_names_its_source_or_is_a_declared_setting():
    """The whole numbers a page quotes as counts are checked like decimals: each is annotated with
    its source (or why it is a setting), or the page declares it a setting with what it counts (the
    part of a fraction that was counted, 8 of 8/164, names its source unless it is a declared
    setting of what the fraction counts: the first 256 of 9,425 prompts)."""
    bad = [f"{page}: {p}" for page, text, declared in _count_regions() for p in count_problems(text, declared)
           if not _unsourced(page, p)]
    assert not bad, f"{len(bad)} counts: {bad}"


def test_every_unsourced_count_is_still_quoted():
    """A count listed as having no source is removed from the list once its page no longer quotes it."""
    left = {(page, p) for page, text, declared in _count_regions() for p in count_problems(text, declared)}
    for page, snippets in UNSOURCED.items():
        for snippet in snippets:
            assert any(p == page and snippet in q for p, q in left), (page, snippet)


@pytest.mark.parametrize("text,n", [
    ("73 test prompts and 5,086 blocks, 39/34 and 8/164, 192 random anchors", 7),
    ("73<!-- src a b --> test prompts and 5,086<!-- src a b --> blocks, 39<!-- src a b -->/34<!-- src a b -->", 0),
    ("<!-- settings: 164 prompts; 1,200 steps --> 164 HumanEval prompts, 1,200 training steps, 8<!-- src a b -->/164",
     0),
    ("<!-- settings: 164 prompts --> 164/164 equal to ar", 1),
    ("<!-- settings: 164 prompts --> it stopped at 68 of 164 HumanEval prompts", 1),
    ("<!-- settings: 164 prompts --> 164 blocks, and gamma 8 at 512 new tokens", 2),
    ("§5.2, Table 4, Eq. 7, A.7, 0.306, `--limit 164`, 2026-05-01, 15:50", 0),
])
def test_the_count_check_finds_counts(text, n):
    assert len(count_problems(text)) == n, count_problems(text)


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
    assert len(sourced) >= 2450  # the checked pages' sourced numbers: a broken pattern cannot skip them unseen
    mutants = [t for text in regions for t in _mutations(text)]
    assert len(mutants) >= 10000
    assert all(problems(t) for t in mutants)


def test_changing_any_digit_of_a_sourced_whole_number_fails_the_check():
    """Whole numbers are checked like decimals: 146 calibration prompts written 147 fails, and so
    does every digit of every sourced whole number of the checked regions and the README."""
    text = "decoded its 146<!-- src online/predictor/prefix/online.json n_prompts --> calibration prompts"
    assert not problems(text) and problems(text.replace("146<", "147<"))
    assert problems("5,087<!-- src full/diagnose-onpolicy1/diagnose.json blocks -->")  # 21,918 blocks, not 5,087
    texts = [text for _, text in _checked_regions()] + [(ROOT / "README.md").read_text()]
    whole = [m for t in texts for m in QUOTED.finditer(_prose(t)) if m["kind"] == "src" and "." not in m["number"]]
    assert len(whole) >= 220
    mutants = [t for text in texts for t in _mutations(text) if "." not in QUOTED.match(t)["number"]]
    assert len(mutants) >= 600 and all(problems(t) for t in mutants)


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


# -- the paper's values, checked against the paper ----------------------------------------------

_HEADING = re.compile(r"(?P<label>(?:\d+|A)(?:\.\d+)?) [A-Z][\w ,:'’()+-]{2,80}")


@lru_cache(maxsize=1)
def _paper() -> dict[str, str]:
    """The paper's places and their text: ``abstract``, each section and subsection by its number
    (``5``, ``5.2``, ``A``, ``A.7``; a section holds its subsections' text), and each ``table N``
    and ``figure N``: its caption and, for a table, its rows."""
    lines = PAPER.read_text().splitlines()
    heads = []
    for i, line in enumerate(lines):
        t = line.strip()
        if t in ("Abstract", "References"):
            heads.append((i, t.lower()))
        elif t.startswith("Appendix A "):
            heads.append((i, "A"))
        elif m := _HEADING.fullmatch(t):
            heads.append((i, m["label"]))
    places: dict[str, str] = {}
    for (i, label), (j, _) in zip(heads, heads[1:] + [(len(lines), "")]):
        for key in {label, label.split(".")[0]}:
            places[key] = places.get(key, "") + "\n" + "\n".join(lines[i:j])
    for i, line in enumerate(lines):
        if m := re.match(r"(Table|Figure) (\d+):", line.strip()):
            k, rows = i + 1, False
            while k < len(lines):  # the caption's lines, then a table's rows (tab-separated), up to the prose
                t = lines[k].strip()
                if "\t" in lines[k]:
                    rows = True
                elif t and (rows or (len(t) > 150 and t[0].isupper())):
                    break
                k += 1
            places[f"{m[1].lower()} {m[2]}"] = "\n".join(lines[i:k])
    return places


def _places(arg: str) -> list[str]:
    """The places an annotation names: ``5.2``, ``A.7``, ``table 1``, ``figure 4``, ``abstract``."""
    out = []
    for m in PLACE.finditer(arg):
        out.append(m["section"] or (f"{m['float'].lower()} {m['n']}" if m["float"] else "abstract"))
    return out


def paper_problems(text: str) -> list[str]:
    """Every paper value that is not in the paper's text at each place its annotation names."""
    out, paper = [], _paper()
    for m in QUOTED.finditer(_prose(text)):
        if m["kind"] != "paper":
            continue
        number = m["number"]
        for place in _places(m["arg"]) or ["(none)"]:
            where = paper.get(place)
            if where is None:
                out.append(f"{number}: the paper has no {place}")
            elif not re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d,]|\.\d)", where):
                out.append(f"{number}: not in the paper's {place}")
    return out


def _paper_or_skip() -> None:
    if not PAPER.exists():
        pytest.skip("../shared/paper.md is not beside this repository: the paper's values are NOT checked here")


def _pages() -> list[tuple[str, str]]:
    """(name, text) of the README and every results page."""
    return [("README.md", (ROOT / "README.md").read_text())] + [
        (p.name, p.read_text()) for p in sorted(RESULTS.glob("*.md"))]


def _paper_values() -> list[tuple[str, re.Match]]:
    return [(name, m) for name, text in _pages() for m in QUOTED.finditer(_prose(text)) if m["kind"] == "paper"]


def test_every_paper_value_is_in_the_paper_where_it_says():
    """A value quoted from the paper is in the paper's text at every place its annotation names
    (a section with its subsections, a table's caption and rows, a figure's caption, the abstract)."""
    _paper_or_skip()
    assert len(_paper_values()) >= 38
    bad = [f"{name}: {p}" for name, text in _pages() for p in paper_problems(text)]
    assert not bad, bad


def test_changing_a_digit_of_a_paper_value_fails_the_paper_check():
    """Each digit of each paper value changed in turn: the check fails, unless the changed value is
    itself at that place in the paper (a table row beside it: 8.75 becomes Table 1's 8.76)."""
    _paper_or_skip()
    caught = beside = 0
    for _, m in _paper_values():
        quoted = m.group(0)
        for i in range(len(m["number"])):
            if not quoted[i].isdigit():
                continue
            mutant = quoted[:i] + str((int(quoted[i]) + 1) % 10) + quoted[i + 1:]
            if paper_problems(mutant):
                caught += 1
                continue
            number = QUOTED.match(mutant)["number"]
            assert all(number in _paper()[p] for p in _places(m["arg"])), mutant
            beside += 1
    assert caught >= 130 and beside <= caught // 20, (caught, beside)


@pytest.mark.parametrize("text,why", [
    ("BCE 0.306<!-- paper: §5.1, average BCE of the marginal predictor -->", "not in the paper's 5.1"),
    ("9.6%<!-- paper: §4, calls saved by marginal survival -->", "not in the paper's 4"),
    ("8.75<!-- paper: Table 9, raw original -->", "the paper has no table 9"),
    ("13.5%<!-- paper: abstract, §1 and §3, calls saved by raw confidence -->", "not in the paper's 3"),
])
def test_the_paper_check_names_a_wrong_place(text, why):
    _paper_or_skip()
    got = paper_problems(text)
    assert len(got) == 1 and why in got[0], got


def test_the_paper_check_reads_every_kind_of_place():
    _paper_or_skip()
    assert not paper_problems("BCE 0.306<!-- paper: §5.2, average BCE --> and 0.9085<!-- paper: §5, pass@1 --> and "
                              "8.76<!-- paper: Table 1, conditional original --> and 0.7503<!-- paper: Table 4 and "
                              "§A.5, MBPP+ --> and 13.5%<!-- paper: abstract, §1 and §5.2, calls saved -->")


# -- the machine beside every speed --------------------------------------------------------------

#: a speed figure: a sourced number whose key is a rate or a time (tokens/s and its ratios, a cost in
#: ms or seconds, a call against its floor, c_D/c_V, the machine's own throughput)
SPEED = re.compile(r"tokens_per_s|tok_s|tok/s|tokens/s|ratio_vs_ar|ratio_ci95|ratio_by_prompt|^pairwise/|speedup"
                   r"|\bc_[DV]|_ms\b|\bms\b|\(ms|seconds|/s$|floor|GFLOP|GBps|outside_forwards|by_repeat|eq7|Eq\. 7")
#: the line that names the machine of a directory's runs: ``Machine: ...<!-- machine DIR -->`` (the
#: text before it back to the previous annotation, list item, table row or paragraph)
MACHINE = re.compile(r"<!-- machine (?P<dir>\S+) -->")


def _machine_lines(prose: str) -> list[tuple[str, str]]:
    """(the text that names a machine, the directory of its runs) of each machine annotation."""
    out = []
    for m in MACHINE.finditer(prose):
        before = prose[:m.start()]
        start = max((i + len(cut) if (i := before.rfind(cut)) >= 0 else 0) for cut in ("-->", "\n\n", "\n- ", "\n|"))
        out.append((" ".join(before[start:].split()), m["dir"]))
    return out
#: a section that sets speeds from several machines side by side says so: ``<!-- machines differ: why -->``
DIFFER = re.compile(r"<!-- machines differ: \S.*?-->", re.S)
EXTENSIONS = ("AVX2", "AVX512F", "AVX512-BF16", "AMX")


@lru_cache(maxsize=None)
def _recorded(directory: str) -> frozenset[str]:
    """The machines the runs under ``directory`` (under docs/results) recorded, each named as
    :func:`vskip.engine.runtime.machine_name` names it: a run's ``config.json``, the rows of a
    comparison, the samples of a run, the cells of a batching protocol, and the runs archived in a ``runs.tar.xz``."""
    import gzip
    import tarfile

    from vskip.engine.runtime import machine_id, machine_name

    def of_config(raw: bytes) -> set[str]:
        m = json.loads(raw).get("machine")
        return {machine_id(m)} if isinstance(m, dict) and "cpu" in m else set()

    def of_lines(raw: bytes) -> set[str]:
        rows = (json.loads(x) for x in raw.decode().splitlines() if x.strip())
        return {machine_name(r["machine"]) for r in rows if isinstance(r, dict) and r.get("machine")}

    names: set[str] = set()
    if directory == ".":  # a file of the results' own folder (scheduler.json): not one run's
        return frozenset()
    for f in sorted((RESULTS / directory).rglob("*")):
        if f.name == "config.json":
            names |= of_config(f.read_bytes())
        elif re.fullmatch(r"shard-.*\.jsonl|samples\.jsonl|cells\.jsonl", f.name):
            names |= of_lines(f.read_bytes())
        elif re.fullmatch(r"shard-.*\.jsonl\.gz|samples\.jsonl\.gz|cells\.jsonl\.gz", f.name):
            names |= of_lines(gzip.decompress(f.read_bytes()))
        elif f.name == "runs.tar.xz":
            with tarfile.open(f) as tar:
                for member in tar.getmembers():
                    if member.name.endswith("/config.json"):
                        names |= of_config(tar.extractfile(member).read())
    return frozenset(names)


def _said(line: str, word: str) -> re.Match | None:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?!\w)", line)


def machine_line_problems(line: str, directory: str) -> list[str]:
    """What a machine line gets wrong about the machines ``directory`` recorded: a line for runs
    that recorded none says "not recorded"; otherwise it names each CPU model and every vector
    extension it had, and (for runs of one machine) an extension it lacked only after a "without",
    "no" or "nor"."""
    if not (RESULTS / directory).is_dir():
        return [f"machine {directory}: no such directory under docs/results"]
    names = _recorded(directory)
    if not names:
        return [] if "not recorded" in line else [f"machine {directory}: its runs record no machine; "
                                                  "say 'not recorded'"]
    out = []
    for name in sorted(names):
        cpu, _, ext = name.split(";")[0].rpartition(" (")
        has = {e.strip() for e in ext.rstrip(")").split(",")} & set(EXTENSIONS)
        words = [w for w in re.sub(r"\((?:R|TM)\)", "", cpu).split()
                 if w not in ("Intel", "AMD", "CPU", "Processor", "@") and not re.fullmatch(r"[\d.]+GHz", w)]
        out += [f"machine {directory}: the line does not name {w} ({name})" for w in words + sorted(has)
                if not _said(line, w)]
        for e in sorted(set(EXTENSIONS) - has) if len(names) == 1 else ():  # several: each names its own
            if (m := _said(line, e)) and not re.search(r"\b(?:without|no|nor|not|lacks?)\b", line[:m.start()]):
                out.append(f"machine {directory}: the line claims {e}, which {name} lacks")
    return out


def _sections(text: str) -> list[str]:
    return re.split(r"(?m)^#{1,6} .*$", text)


def machine_problems(text: str) -> list[str]:
    """Per section (between headings) of a page: a section with a speed figure holds a machine
    line; each machine line is right (:func:`machine_line_problems`); a figure whose runs recorded
    their machine has a line of that machine in its section; and a section whose figures and lines
    come from more than one machine says so (``<!-- machines differ: why -->``)."""
    out = []
    for section in _sections(text):
        prose = _prose(section)
        figures = [m for m in QUOTED.finditer(prose) if m["kind"] == "src" and SPEED.search(m["arg"].split(" ", 1)[-1])]
        lines = _machine_lines(prose)
        for m in COPY.finditer(section):  # a verbatim copy of a summary that ends with its machine line
            named = [x for x in m.group(2).splitlines() if x.startswith(("Machine: ", "Machines "))]
            lines += [(x, str(Path(m.group(1)).parent)) for x in named]
        if figures and not lines:
            out.append(f"speed figures without a machine line in their section: {figures[0]['number']} "
                       f"({figures[0]['arg']})")
        for line, d in lines:
            out += machine_line_problems(line, d)
        named = {_recorded(d) or frozenset({"not recorded"}) for _, d in lines}
        for f in figures:
            d = str(Path(f["arg"].split(" ", 1)[0]).parent)
            if _recorded(d) and _recorded(d) not in named:
                out.append(f"{f['number']} ({f['arg']}): no machine line of its runs' machine {sorted(_recorded(d))}")
        machines = set().union(*named) if named else set()
        machines |= {x for f in figures for x in _recorded(str(Path(f["arg"].split(" ", 1)[0]).parent))}
        if len(machines) > 1 and not DIFFER.search(section):
            out.append(f"speeds from {len(machines)} machines side by side, unmarked: {sorted(machines)}")
    return out


def _speed_figures() -> list[str]:
    return [m["arg"] for _, text in _pages() for m in QUOTED.finditer(_prose(text))
            if m["kind"] == "src" and SPEED.search(m["arg"].split(" ", 1)[-1])]


def test_every_speed_figure_has_its_machine_beside_it():
    assert len(_speed_figures()) >= 300
    bad = [f"{name}: {p}" for name, text in _pages() for p in machine_problems(text)]
    assert not bad, f"{len(bad)}: {bad}"


_EPYC = "0.970×<!-- src sampling/he164-T0.6/summary.json configs/strict/ratio_vs_ar -->"
_XEON = "0.705<!-- src engine/fp32/summary.json configs/strict/ratio_vs_ar -->"
_EPYC_LINE = ("Machine: AMD EPYC, 2 cores, AVX2 only (no AVX512F, AVX512-BF16 or AMX)"
              "<!-- machine sampling/he164-T0.6 -->")
_XEON_LINE = "Machine: Intel Xeon, AVX2 and AVX512F, without AVX512-BF16 or AMX<!-- machine engine/fp32 -->"


@pytest.mark.parametrize("text,why", [
    (f"## a\nStrict SDD at {_EPYC} ar.", "without a machine line"),
    (f"## a\n{_EPYC}.\n\nMachine: AMD EPYC with AVX2, AVX512-BF16 and AMX<!-- machine sampling/he164-T0.6 -->",
     "claims AMX"),
    (f"## a\n{_EPYC}.\n\nMachine: a Xeon with AVX2<!-- machine sampling/he164-T0.6 -->", "does not name EPYC"),
    (f"## a\n{_EPYC}.\n{_EPYC_LINE}\n\n## b\n{_XEON}", "without a machine line"),
    ("## a\n1.499×<!-- src speed/he164/summary.json configs/strict/ratio_vs_ar -->, on a CPU with AMX"
     "<!-- machine speed/he164 -->", "say 'not recorded'"),
    (f"## a\n{_EPYC} and {_XEON}.\n{_EPYC_LINE}\n{_XEON_LINE}", "side by side, unmarked"),
    (f"## a\n{_XEON}.\n{_EPYC_LINE}", "no machine line of its runs' machine"),
])
def test_the_machine_check_names_what_is_wrong(text, why):
    got = machine_problems(text)
    assert any(why in p for p in got), got


def test_the_machine_check_passes_right_lines():
    assert not machine_problems(f"## a\n{_EPYC}.\n{_EPYC_LINE}\n\n## b\n{_XEON}, {_XEON_LINE}")
    assert not machine_problems(f"## a\n{_EPYC} and {_XEON} (<!-- machines differ: each against its own ar -->).\n"
                                f"{_EPYC_LINE}\n{_XEON_LINE}")
    assert not machine_problems("1.499×<!-- src speed/he164/summary.json configs/strict/ratio_vs_ar -->; machine "
                                "not recorded by the rows<!-- machine speed/he164 -->")
