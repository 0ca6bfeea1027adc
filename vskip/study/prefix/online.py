"""The online calibration's files and runs (``vskip calibrate-online``): the prompt ids of each
task that ``init`` writes beside the one-rotation model (``ids/TASK.cal``, ``ids/TASK.test``),
the sweeps that decode them (grids ``online-cal`` and ``online-test``, one sweep directory per
task), and the calibration runs of the thresholds every task finished, which ``choose`` and the
report read."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ...files import own_dir, write_atomic
from ..grids import grid
from ..rundir import SUMMARY

IDS = "ids"
#: the prompts each part decodes with the grid it decodes them at
PARTS = {"cal": "online-cal", "test": "online-test"}


def task_of(task_id: str) -> str:
    """The task a prompt id belongs to: ``HumanEval/3`` -> ``humaneval``."""
    return task_id.split("/")[0].lower()


def write_ids(path, cal: Sequence[str], test: Sequence[str]) -> list[tuple[Path, int]]:
    """``path/ids/TASK.PART``: each part's prompt ids of each task, comma-separated; returns the files
    written with their number of prompts."""
    out = []
    own_dir(Path(path) / IDS)
    for part, ids in (("cal", cal), ("test", test)):
        for t in sorted({task_of(i) for i in ids}):
            mine = [i for i in ids if task_of(i) == t]
            out.append((write_atomic(Path(path) / IDS / f"{t}.{part}", ",".join(mine) + "\n"), len(mine)))
    return out


def read_ids(path, part: str) -> dict[str, str]:
    """{task: its ``--ids`` of ``part``} from what ``init`` wrote, tasks in name order."""
    files = sorted((Path(path) / IDS).glob(f"*.{part}"))
    if not files:
        raise ValueError(f"{path} holds no {part} prompt ids (make it with `vskip calibrate-online init`)")
    return {f.name[: -len(part) - 1]: f.read_text().strip() for f in files}


def sweep_commands(path, part: str, out, max_new_tokens: int, threads: int = 1,
                   batch_size: int = 1) -> list[list[str]]:
    """One ``vskip sweep`` per task of the grid of ``part`` on its prompts of ``part``, into ``out/TASK``,
    each decoding ``batch_size`` prompts side by side (``--batch-size``)."""
    return [["sweep", "--task", t, "--grid", PARTS[part], "--ids", ids, "--predictor", str(path), "--max-new-tokens",
             str(max_new_tokens), "--threads", str(threads), "--batch-size", str(batch_size), "--quiet",
             "--out", str(Path(out) / t)]
            for t, ids in read_ids(path, part).items()]


def finished(path, cal) -> list[Path]:
    """The calibration runs under ``cal/TASK`` of each threshold of grid ``online-cal`` that every
    task finished (its summary written), the lowest threshold first, tasks in name order. The grid
    is decoded from the most cautious threshold down, so a calibration stopped early holds the top
    of it and chooses there."""
    tasks = list(read_ids(path, "cal"))
    out = []
    for pt in sorted(grid(PARTS["cal"]), key=lambda pt: pt.policy.lam):
        runs = [Path(cal) / t / pt.name for t in tasks]
        if all((r / SUMMARY).is_file() for r in runs):
            out += runs
    return out
