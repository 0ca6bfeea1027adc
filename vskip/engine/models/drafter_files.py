"""A drafter's files before they load: its directory, its manifest's hashes against the files,
and the copy prior ``--copy-prior`` names (with a warning when it was fitted to other weights)."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from .copy import COPY_FILE, CopyPrior
from .embedded import EMBEDDED_CONDITIONED, EMBEDDED_DRAFTER, embedded_drafter_dir, file_sha256


def resolve_drafter_dir(drafter: str | None) -> Path:
    if drafter == EMBEDDED_CONDITIONED:
        return embedded_drafter_dir(EMBEDDED_CONDITIONED)
    return embedded_drafter_dir() if drafter in (None, "", "default", EMBEDDED_DRAFTER) else Path(drafter)


def verify_drafter(ddir: Path, vdir: Path, required: bool = False) -> None:
    """Check a drafter directory's files against its ``manifest.json`` before loading them: the
    weights' and the copy prior's sha256 must match (a damaged file refuses with one line saying
    how to rebuild it). ``required``: the manifest itself must be there and whole (the embedded
    drafter ships one). Warns when the drafter was distilled from another verifier file."""
    from ...files import FileError, read_json
    from .embedded import file_sha256

    path = Path(ddir) / "manifest.json"
    if not path.exists():
        if required:
            raise FileError(f"{path} is missing: the drafter cannot be checked; reinstall vskip")
        return
    try:
        m = read_json(path, "drafter manifest")
    except FileError:
        if required:
            raise FileError(f"drafter manifest {path} is damaged; reinstall vskip") from None
        raise
    for key, rebuild in (("weights", "reinstall vskip or re-export it (vskip train-drafter --export)"),
                         ("copy_prior", "refit it (vskip fit-copy-prior) or reinstall vskip")):
        entry = m.get(key) if isinstance(m, dict) else None
        if not isinstance(entry, dict) or "file" not in entry or "sha256" not in entry:
            if required and key == "weights":
                raise FileError(f"drafter manifest {path} records no weights hash; reinstall vskip")
            continue
        f = Path(ddir) / entry["file"]
        if not f.exists():
            if key == "weights":
                raise FileNotFoundError(f"drafter weights {f} are missing; {rebuild}")
            if required:  # a shipped drafter without the prior its manifest names: never silently
                raise FileNotFoundError(f"{f} is missing; {rebuild}")
            continue
        if file_sha256(f) != entry["sha256"]:
            raise FileError(f"{f} does not match the sha256 in {path}: the file is damaged; {rebuild}")
    try:
        want = m["verifier"]["verifier_source_sha256"]
        have = json.loads((Path(vdir) / "vskip.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return
    if want != have:
        print(f"vskip: warning: the drafter was distilled from verifier {want[:12]}, "
              f"but {vdir} holds {have[:12]}", file=sys.stderr)


def resolve_copy_prior(choice: str | None, drafter_dir: Path | None) -> CopyPrior | None:
    """The copy prior named by ``--copy-prior`` (see :func:`load_pair`)."""
    if choice in (None, "off", "none"):
        return None
    if choice == "auto":
        path = Path(drafter_dir) / COPY_FILE if drafter_dir is not None else None
        if path is None or not path.exists():
            return None
    else:
        path = Path(choice)
        if path.is_dir():
            path = path / COPY_FILE
        if not path.exists():
            raise FileNotFoundError(f"copy prior {choice} does not exist")
        if not path.is_file():  # a FIFO would block the read
            raise ValueError(f"copy prior {path} is not a regular file")
    try:
        data = json.loads(path.read_text())
        prior = CopyPrior.from_json(data)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} is not a copy prior: {e}") from None
    return replace(prior, meta=prior.meta | {"sha256": file_sha256(path)})


def _warn_if_fitted_elsewhere(prior: CopyPrior, ddir: Path) -> None:
    """A copy prior is fitted to one network's probabilities: warn when the one it records is not
    the drafter it is about to mix with (its weights' sha256 against the manifest's, else the file's)."""
    fitted = prior.meta.get("drafter_weights_sha256")
    if not isinstance(fitted, dict) or not fitted:
        return
    from .embedded import file_sha256

    try:
        m = json.loads((Path(ddir) / "manifest.json").read_text())
        have = {m["weights"]["file"]: m["weights"]["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        have = {name: file_sha256(Path(ddir) / name) for name in fitted if (Path(ddir) / name).exists()}
    if any(have.get(name) != sha for name, sha in fitted.items()):
        print(f"vskip: warning: the copy prior was fitted to other drafter weights than those in {ddir}; "
              "refit it (vskip fit-copy-prior) or pass --copy-prior off", file=sys.stderr)
