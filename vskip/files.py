"""Files that must never be left half-written, misread without a name, or written by two processes.

One module for what every result directory needs:

- :func:`write_atomic` (text, bytes, or a callback that writes a temporary path): write a sibling
  temporary file, flush it to disk, rename it over the target. A reader sees the old file or the
  new one, never a mix; a kill leaves at most a ``.tmp`` file behind.
- :func:`read_json` and :func:`read_jsonl` (the one JSONL reader; :func:`read_jsonl_lines` gives
  the line numbers too): errors name the file and line; a JSONL file vskip appends to whose last
  line was cut by a kill drops that line (a resume truncates it away and redoes it) and says so,
  while a file someone gave must exist and be whole.
- :class:`DirLock`: an exclusive ``flock`` on a file in a directory, so a second writer refuses at
  once instead of interleaving its results with the first one's.
- Nothing is written through a link: a replaced file's link is replaced (:func:`write_atomic`,
  :func:`copy_file`), appends (:func:`open_append`), the lock file and the directories vskip makes
  (:func:`own_dir`) refuse links, and a device node, FIFO or socket is never replaced.
- :func:`check_writable_dir`: the one check of every command's output directory (not ``''``, not
  ``/``, not a link, not a file), with :func:`check_output_path` for an output file.

Standard library only.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Callable, Iterable

LOCK_FILE = ".lock"


class FileError(ValueError):
    """A file that exists but cannot be used: the message names it."""


class Busy(FileError):
    """A directory another process holds the :class:`DirLock` of."""


def file_sha256(path: Path | str, chunk: int = 1 << 20) -> str:
    """The sha256 of a file's bytes (read in chunks), as hex."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


class naming:
    """Give an OS error that names no file (a full disk, an I/O error) the name of ``path``, so
    that the one line the command line prints says which file could not be written."""

    def __init__(self, path):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if kind is not None and issubclass(kind, OSError) and err.filename is None and err.errno is not None:
            raise OSError(err.errno, err.strerror or str(err), str(self.path)) from None
        return False


def write_atomic(path: Path | str, data: str | bytes | Callable[[str], None]) -> Path:
    """Replace ``path`` with ``data`` atomically. ``data`` is text (UTF-8), bytes, or a function
    that writes a file at the temporary path it is given (for writers that take a path)."""
    import tempfile

    path = Path(path)
    _replaceable(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # unique per writer
    os.close(fd)
    tmp = Path(name)
    try:
        with naming(path):
            if callable(data):
                data(str(tmp))
            else:
                with open(tmp, "wb") as f:
                    f.write(data.encode("utf-8") if isinstance(data, str) else data)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def check_output_file(path: Path) -> Path:
    """Refuse to replace anything but a regular file or a link (a link is replaced, never written
    through): a device node, a FIFO or a socket given as an output is not vskip's to replace."""
    _replaceable(Path(path))
    return Path(path)


def check_output_path(path: Path | str | None, what: str = "--out") -> Path:
    """An output *file* a command will write: named, not a directory, replaceable
    (:func:`check_output_file`), in a directory that passes :func:`check_writable_dir`."""
    if path is None or not str(path).strip():
        raise FileError(f"{what} is empty: name a file")
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        raise FileError(f"{what} {path} is a directory; name a file")
    check_writable_dir(path.parent, f"directory of {what}")
    return check_output_file(path)


def own_dir(path: Path | str) -> Path:
    """``path`` as a directory of vskip's own inside an output directory: created with its parents
    if missing, never a link (a link planted where vskip makes a directory would send its files
    elsewhere)."""
    path = Path(path)
    if path.is_symlink():
        raise FileError(f"{path} is a link; vskip writes only into directories of its own (remove the link)")
    path.mkdir(parents=True, exist_ok=True)
    return path


def copy_file(src: Path | str, dst: Path | str) -> Path:
    """``src``'s bytes at ``dst``, atomically: a link at ``dst`` is replaced, never written through."""
    import shutil

    return write_atomic(dst, lambda tmp: shutil.copyfile(src, tmp))


def _replaceable(path: Path) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        raise FileError(f"{path} exists and is not a regular file; name another output")


def save_figure(fig, path: Path | str, dpi: int = 120) -> Path:
    """A matplotlib figure written atomically (never through a link), in the format of its suffix."""
    path = Path(path)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png"))


def open_append(path: Path | str):
    """``path`` opened for appending text, refusing to follow a link (a link planted in an output
    directory must not send vskip's rows to a file outside it) or to append to a non-regular file."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileError(f"{path} is a link; vskip writes only its own files (remove the link)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileError(f"{path} is not a regular file; vskip writes only its own files")
    return os.fdopen(fd, "a", encoding="utf-8")


def write_json(path: Path | str, obj, indent: int | None = 1) -> Path:
    return write_atomic(path, json.dumps(obj, indent=indent) + "\n")


def write_jsonl(path: Path | str, rows: Iterable[dict]) -> Path:
    return write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def write_csv(path: Path | str, headers: Iterable, rows: Iterable[Iterable]) -> Path:
    """A CSV table, atomically; a non-finite float is an empty cell."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(list(headers))
    for r in rows:
        w.writerow([("" if isinstance(v, float) and not math.isfinite(v) else v) for v in r])
    return write_atomic(path, buf.getvalue())


def read_json(path: Path | str, what: str = "JSON file"):
    """The parsed contents of ``path``; a missing file raises FileNotFoundError and an unreadable
    one :class:`FileError`, both naming it."""
    path = Path(path)
    if not path.is_file():
        if path.exists():
            raise FileError(f"{what} {path} is not a file")
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise FileError(f"{path}: {what} nests too deeply to be one vskip wrote") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise FileError(f"{what} {path} is not valid JSON ({e})") from None


def read_jsonl(path: Path | str, on_cut: Callable[[str], None] | None = None, partial: bool = False,
               given: str | None = None) -> list[dict]:
    """The rows of a JSONL file: :func:`read_jsonl_lines` without the line numbers."""
    return [row for _, row in read_jsonl_lines(path, on_cut, partial, given)]


def read_jsonl_lines(path: Path | str, on_cut: Callable[[str], None] | None = None, partial: bool = False,
                     given: str | None = None) -> list[tuple[int, dict]]:
    """The rows of a JSONL file (``.jsonl.gz`` too), each with its line number, for messages that
    name it. A file vskip appends to has no rows before it exists, and a last line without its
    newline that does not parse was cut by a kill: it is dropped (``on_cut`` hears about it). A
    file someone gave (``given`` says what it is: a samples file, a benchmark's data) must exist
    (:class:`FileNotFoundError` naming it) and be whole. Any other line that is not a JSON object
    raises :class:`FileError` naming the file and line; with ``partial``, it ends the reading
    instead, keeping the rows before it (``on_cut`` hears)."""
    path = Path(path)
    if not path.exists():
        if given:
            raise FileNotFoundError(f"{given} {path} does not exist")
        return []
    if not path.is_file():  # a FIFO or a device would block or never end
        raise FileError(f"{path} is not a regular file")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        import gzip

        try:
            raw = gzip.decompress(raw)
        except (gzip.BadGzipFile, EOFError) as e:
            raise FileError(f"{path} is not a readable gzip file ({e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileError(f"{path} is not UTF-8 text ({e})") from None
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except RecursionError:
            raise FileError(f"{path}: line {i + 1} nests too deeply to be a row vskip wrote") from None
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append((i + 1, row))
        elif partial:
            if on_cut:
                on_cut(f"{path}: line {i + 1} is cut or invalid; read the {len(rows)} lines before it")
            break
        elif row is None and i == len(lines) - 1 and not given:  # no newline after it: the write was cut
            if on_cut:
                on_cut(f"{path}: dropped a cut last line")
        else:
            raise FileError(f"{path} line {i + 1} is " + ("not valid JSON" if row is None else "not a JSON object"))
    return rows


def check_writable_dir(path: Path | str | None, what: str = "output directory") -> Path:
    """The one check of a directory a command writes into, before any work: it is named (not
    ``''``), it is not the root directory, it is not a link (whose target would receive the files)
    and not a file; then it is created if needed and a file written in it once, anew."""
    if path is None or not str(path).strip():
        raise FileError(f"{what} is empty: name a directory")
    path = Path(path)
    if os.path.realpath(path) == os.path.realpath(os.sep):
        raise FileError(f"{what} {path} is the root directory; name a directory of its own")
    if path.is_symlink():
        raise FileError(f"{what} {path} is a link; name the directory itself (vskip writes through no link)")
    if path.exists() and not path.is_dir():
        kind = "a file" if path.is_file() else "not a regular file"
        raise FileError(f"{what} {path} is {kind}, not a directory")
    try:
        import tempfile

        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test.")  # created anew: never through a link
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise FileError(f"cannot write in {what} {path}: {e.strerror or e}") from None
    return path


def check_regular_file(path: Path | str, what: str = "file") -> Path:
    """A file a command reads as configuration or weights: it exists and is a regular file (a FIFO
    or a device would block the read or never end; a directory fails late and unclearly)."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {path} does not exist") from None
    if stat.S_ISDIR(mode):
        raise FileError(f"{what} {path} is a directory, not a file")
    if not stat.S_ISREG(mode):
        raise FileError(f"{what} {path} is not a regular file (a FIFO or a device is never read)")
    return path


def check_input_dir(path: Path | str, what: str = "directory", hint: str = "") -> Path:
    """A directory a command reads: one that does not exist and one that is a file (or a FIFO)
    are told apart in the message, which names it (and ``hint``: how to make it)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist{hint}")
    if not path.is_dir():
        kind = "a file" if path.is_file() else "not a regular file"
        raise FileError(f"{what} {path} is {kind}, not a directory")
    return path


def _open_lock(path: Path):
    """The lock file, opened without following a link and only if it is a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileError(f"{path} is a link; remove it (vskip's lock file is a plain file)") from None
        raise FileError(f"cannot open the lock file {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileError(f"{path} is not a regular file; remove it")
    return os.fdopen(fd, "r+")


class DirLock:
    """An exclusive lock on a directory for as long as the ``with`` block runs; a second holder
    gets :class:`Busy` (a :class:`FileError`) at once, or with ``wait`` waits for the first to
    finish. The lock dies with its process, so a kill never leaves a stale lock behind."""

    def __init__(self, directory: Path | str, what: str = "directory", wait: bool = False, name: str = LOCK_FILE):
        self.dir, self.what, self.wait, self.name = Path(directory), what, wait, name
        self._f = None

    def __enter__(self) -> "DirLock":
        import fcntl

        self.dir.mkdir(parents=True, exist_ok=True)
        f = _open_lock(self.dir / self.name)
        try:
            fcntl.flock(f, fcntl.LOCK_EX if self.wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise Busy(f"another process is writing {self.what} {self.dir}; wait for it or use another") from None
        try:
            with naming(self.dir / self.name):  # a full disk names the lock file
                f.seek(0)
                f.truncate()
                f.write(str(os.getpid()))
                f.flush()
        except BaseException:
            f.close()
            raise
        self._f = f
        return self

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class built_dir:
    """``with built_dir(out) as tmp:`` builds a directory in ``tmp`` beside ``out`` and renames it
    into place (replacing an old ``out``) once the block ends without an error; a failure leaves
    ``out`` as it was and no ``tmp`` behind. Whoever builds ``out`` holds its lock."""

    def __init__(self, out: Path | str):
        self.out = Path(out)

    def __enter__(self) -> Path:
        import tempfile

        self.tmp = Path(tempfile.mkdtemp(prefix=self.out.name + ".tmp-", dir=self.out.parent))
        return self.tmp

    def __exit__(self, kind, err, tb) -> bool:
        import shutil

        try:
            if kind is None:
                if self.out.exists():
                    shutil.rmtree(self.out)
                self.tmp.rename(self.out)
        finally:
            if self.tmp.exists():
                shutil.rmtree(self.tmp, ignore_errors=True)
        return False


def stat_key(path: Path | str) -> str:
    """16 hex digits naming a file by its resolved path, size and modification time: how a cache
    finds what it made from a file without hashing a large one at every start."""
    import hashlib

    path = Path(path).resolve()
    st = path.stat()
    return hashlib.sha256(f"{path}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
