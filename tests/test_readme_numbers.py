"""Every measured number the README quotes is in a committed result file (docs/results), to the
precision the README gives it; the drafter's size is that of its shipped weights."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
NUMBER = re.compile(r"(?<![\w.])(\d+\.\d+)(?![\w.])")


def _section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end >= 0 else len(text)]


def _result_numbers() -> list[float]:
    found = []
    for path in (ROOT / "docs" / "results").rglob("*"):
        if path.suffix in (".json", ".md", ".csv"):
            found += [float(x) for x in re.findall(r"-?\d+\.\d+|-?\d+", path.read_text(errors="ignore"))]
    return found


def test_readme_numbers_are_in_committed_results():
    readme = (ROOT / "README.md").read_text()
    text = _section(readme, "## The embedded default pair")
    size = re.search(r"(\d+\.\d+) MB", text)
    weights = ROOT / "vskip" / "assets" / "smollm2-135m-diffusion" / "drafter.safetensors"
    assert size and abs(weights.stat().st_size / 1e6 - float(size.group(1))) < 0.05
    text = text.replace(size.group(0), "")
    numbers = _result_numbers()
    missing = []
    for x in sorted(set(NUMBER.findall(text))):
        d = len(x.split(".")[1])
        if not any(round(y, d) == float(x) for y in numbers):
            missing.append(x)
    assert not missing, f"README numbers in no committed result file: {missing}"
    for a, b in re.findall(r"\b(\d+)/(\d+)\b", text):  # counts such as 164/164
        assert any(f"{a}/{b}" in p.read_text(errors="ignore") for p in (ROOT / "docs" / "results").rglob("*.md"))


def test_the_check_can_fail():
    numbers = _result_numbers()
    assert not any(round(y, 3) == 9.871 for y in numbers)  # a number no result holds
