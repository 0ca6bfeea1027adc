"""The security table: the hostile corpora of the test suite, counted per sandbox mode, and the
bad-input corpus, counted by outcome. Runs the tests (about two minutes) and writes
``security.json`` and ``security.md`` into ``--out``. Usage::

    python scripts/security_report.py --out docs/results/security

Modes this machine cannot run (or must not: ``rlimits-own-uid`` runs hostile code as the scorer's
own uid) are listed with the reason instead of counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

from vskip.bench import sandbox

ROOT = Path(__file__).resolve().parent.parent
MODES = ("bubblewrap", "namespaces", "rlimits", "rlimits-own-uid")
TESTS = ["tests/test_sandbox.py", "tests/test_scoring.py::test_hostile_completion_does_not_pass",
         "tests/test_verdict.py", "tests/test_bad_input.py::test_bad_input_is_one_line_naming_the_problem"]
#: the routes that forged a pass before the verdict of docs/security.md, by the start of their names in
#: tests/test_verdict.py::test_forged_pass_route
ROUTES = (("hook_reentry", "1. re-entering the verdict's audit hook"),
          ("namespace_swap", "2. swapping the runner's namespace"),
          ("builtin_shadow", "3. shadowing a builtin the tests use"),
          ("module_", "3. shadowing or patching a module the tests import"),
          ("prompt_helper", "3. redefining or patching a prompt helper the tests call"),
          ("memory", "probe: reading memory through a directory descriptor"))
CHEAP = "the cheap routes (tests/test_scoring.py)"


def _hostile_sandbox_tests() -> set[str]:
    text = (ROOT / "tests" / "test_sandbox.py").read_text().split(" hostile programs\n", 1)[1]
    return set(re.findall(r"^def (test_\w+)\(kind", text, re.M))


def _mode_state(mode: str) -> str:
    """'runs', or why the mode does not run hostile programs on this machine."""
    if mode == "rlimits-own-uid":
        return "not run: it runs hostile code as the scorer's own uid" + (" (root here)" if os.geteuid() == 0 else "")
    try:
        got = sandbox.sandbox_kind(mode)
    except RuntimeError as exc:
        return "refused here: " + str(exc).splitlines()[0].split(" (", 1)[0].split(";", 1)[0]
    return "runs" if got == mode else f"stands in as {got}"


def _failure_kind(message: str) -> str:
    if "Traceback" in message:
        return "traceback"
    if "assert rc == 2" in message:
        return "wrong exit status"
    if "lines and lines[0]" in message:
        return "no one-line error"
    return "cause not named"


def run_tests(junit: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *TESTS]
    subprocess.run(cmd, cwd=ROOT, check=False)
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        cases.append({"name": case.get("name"), "file": case.get("classname", ""),
                      "outcome": "skipped" if case.find("skipped") is not None else ("failed" if failed is not None else "passed"),
                      "message": (failed.get("message", "") + (failed.text or "")) if failed is not None else ""})
    return cases


def tabulate(cases: list[dict]) -> dict:
    auto = sandbox.sandbox_kind("auto")
    hostile = _hostile_sandbox_tests()
    programs = {m: Counter() for m in MODES}
    completions = {m: Counter() for m in MODES}
    routes = {label: {m: Counter() for m in MODES} for label in dict.fromkeys([*(r for _, r in ROUTES), CHEAP])}
    residual: dict[str, dict[str, str]] = {}
    probes = Counter()
    for c in cases:
        base, _, param = c["name"].partition("[")
        params = param.rstrip("]").split("-") if param else []
        if "test_bad_input" in c["file"]:
            probes["probes"] += 1
            probes["clean" if c["outcome"] == "passed" else _failure_kind(c["message"])] += 1
            continue
        if base in ("test_hostile_completion_does_not_pass", "test_forged_pass_route"):
            mode = auto if params[-1] == "auto" else params[-1]
            label = CHEAP if base == "test_hostile_completion_does_not_pass" else next(
                (r for start, r in ROUTES if params[0].startswith(start)), CHEAP)
            outcome = "not a pass" if c["outcome"] == "passed" else "forged or escaped"
            for counts in (completions[mode], routes[label][mode]):
                counts["run"] += 1
                counts[outcome] += 1
        elif base.startswith("test_residual_") and c["outcome"] != "skipped":
            mode = auto if params and params[-1] == "auto" else (params[-1] if params else auto)
            residual.setdefault(base.removeprefix("test_residual_"), {})[mode] = (
                "as documented" if c["outcome"] == "passed" else "differs: " + c["message"].splitlines()[0][:80])
        elif base in hostile:
            mode = next((p for p in params if p in MODES), None)
            if mode is None:
                continue
            programs[mode]["run"] += 1
            programs[mode]["contained" if c["outcome"] == "passed" else "escaped"] += 1
    return {
        "machine": {"python": platform.python_version(), "root": os.geteuid() == 0, "auto": auto},
        "modes": {m: {"state": _mode_state(m), "hostile_programs": dict(programs[m]),
                      "hostile_completions": dict(completions[m])} for m in MODES},
        "routes": {label: {m: dict(n) for m, n in per.items() if n} for label, per in routes.items()},
        "residual": residual,
        "bad_input": dict(probes),
        "failed_tests": [c["name"] for c in cases if c["outcome"] == "failed"],
    }


def markdown(result: dict, command: str) -> str:
    lines = [
        "# Security corpora per sandbox mode",
        "",
        f"Regenerate: `{command}` (runs the hostile and bad-input tests of the suite; two cores, about two minutes).",
        "",
        f"Python {result['machine']['python']}, {'as root' if result['machine']['root'] else 'not root'}; "
        f"`auto` picks `{result['machine']['auto']}` here. Hostile programs: the hostile section of "
        "`tests/test_sandbox.py` (limits, kills, network, files, secrets, signals; counted as contained when the "
        "test passes). Hostile completions: `tests/test_scoring.py` and `tests/test_verdict.py` (early exits, forged "
        "markers and verdicts, introspection, the hook re-entered, the runner's namespace swapped, builtins and "
        "modules shadowed; counted as not a pass when the test passes).",
        "",
        "| mode | on this machine | hostile programs run | contained | escaped | hostile completions run | not a pass | forged or escaped |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, row in result["modes"].items():
        p, c = row["hostile_programs"], row["hostile_completions"]
        lines.append(f"| {mode} | {row['state']} | {p.get('run', 0)} | {p.get('contained', 0)} | {p.get('escaped', 0)} | "
                     f"{c.get('run', 0)} | {c.get('not a pass', 0)} | {c.get('forged or escaped', 0)} |")
    modes = [m for m in MODES if any(m in per for per in result.get("routes", {}).values())]
    lines += [
        "",
        "Forged passes per route (`tests/test_verdict.py::test_forged_pass_route`, each a route that forged a pass "
        "before the verdict of docs/security.md; the cheap routes of `tests/test_scoring.py` beside them): "
        "completions run / not a pass / forged.",
        "",
        "| route | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for label, per in result.get("routes", {}).items():
        cells = [f"{per[m].get('run', 0)} / {per[m].get('not a pass', 0)} / {per[m].get('forged or escaped', 0)}"
                 if m in per else "not run" for m in modes]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    res = result.get("residual", {})
    rmodes = sorted({m for per in res.values() for m in per}, key=MODES.index)
    lines += [
        "",
        "Residual routes (`tests/test_verdict.py::test_residual_*`: what each can and cannot do, as docs/security.md "
        "states it):",
        "",
        "| residual route | " + " | ".join(rmodes) + " |",
        "|---|" + "---|" * len(rmodes),
    ]
    for name, per in res.items():
        lines.append(f"| {name.replace('_', ' ')} | " + " | ".join(per.get(m, "not run") for m in rmodes) + " |")
    b = result["bad_input"]
    kinds = ("traceback", "wrong exit status", "no one-line error", "cause not named")
    lines += [
        "",
        "Bad-input probes (`tests/test_bad_input.py`: every command, before any model loads):",
        "",
        "| probes | clean (one line, exit 2, cause named) | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
        f"| {b.get('probes', 0)} | {b.get('clean', 0)} | " + " | ".join(str(b.get(k, 0)) for k in kinds) + " |",
        "",
        "Failed tests: " + (", ".join(f"`{n}`" for n in result["failed_tests"]) or "none") + ".",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results/security")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        result = tabulate(run_tests(Path(tmp) / "junit.xml"))
    command = f"python scripts/security_report.py --out {args.out}"
    (out / "security.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "security.md").write_text(markdown(result, command))
    print(markdown(result, command))
    return 1 if result["failed_tests"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
