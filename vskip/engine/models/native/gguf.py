"""The GGUF format, read by our own reader: the header, the metadata, the tensor infos and the data
memory-mapped, every count, length, offset and type checked against the file before anything is
believed (:class:`FormatError`, one line naming the file and, where one is concerned, the tensor).
What a file's tensors stand for, and the checks against a model's shape, are :mod:`.gguf_io`'s.

The format (little-endian): ``GGUF``, a uint32 version (2 or 3 read here), uint64 tensor and
metadata counts; metadata entries (a string key, a uint32 value type, the value; a string is a
uint64 length and UTF-8 bytes; an array a uint32 element type, a uint64 count and the elements);
tensor infos (a string name, a uint32 count of dimensions, uint64 dimensions innermost first, a
uint32 ggml type, a uint64 offset from the data start); the data, starting at the next multiple of
``general.alignment`` (32 unless the metadata says), each tensor at a multiple of it.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


class FormatError(ValueError):
    """A file the native runtime will not read: its message is one line naming the file and,
    where one is concerned, the tensor."""


def _line(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def format_error(path, message: str, tensor: str | None = None) -> FormatError:
    """The :class:`FormatError` of ``path`` (and ``tensor``): ``path: tensor 'name': message``, one line."""
    where = f"{path}: " + (f"tensor {tensor!r}: " if tensor is not None else "")
    return FormatError(_line(where + message))


_fail = format_error


# --- the format's tables ---------------------------------------------------------------------------

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays: deeper than this is no file anyone writes

#: metadata value types: id -> (name, struct format) (None: string, array)
VALUE_TYPES = {0: ("UINT8", "<B"), 1: ("INT8", "<b"), 2: ("UINT16", "<H"), 3: ("INT16", "<h"), 4: ("UINT32", "<I"),
               5: ("INT32", "<i"), 6: ("FLOAT32", "<f"), 7: ("BOOL", "<B"), 8: ("STRING", None), 9: ("ARRAY", None),
               10: ("UINT64", "<Q"), 11: ("INT64", "<q"), 12: ("FLOAT64", "<d")}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}

#: ggml tensor types: id -> (name, values per block, bytes per block) (ggml.h / gguf's constants)
TENSOR_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18),
}
TYPE_IDS = {name: i for i, (name, _, _) in TENSOR_TYPES.items()}

#: what the native runtime reads: block types as they are, float types converted
BLOCK_TYPES = ("Q4_0", "Q4_1", "Q8_0")
FLOAT_TYPES = ("F32", "F16", "BF16")
READ_TYPES = BLOCK_TYPES + FLOAT_TYPES


# --- the reader ----------------------------------------------------------------------------------

class GGUFArray:
    """A metadata array of strings (or of arrays), read on demand: its elements' offsets are known,
    nothing is decoded until asked (a tokenizer's 50k tokens cost nothing unless used)."""

    def __init__(self, buf, path, key: str, elem_type: int, starts: list, values: list | None = None):
        self._buf, self._path, self.key, self.elem_type = buf, path, key, elem_type
        self._starts = starts  # strings: (offset, length) per element
        self._values = values  # arrays of arrays: the parsed elements

    def __len__(self) -> int:
        return len(self._values) if self._values is not None else len(self._starts)

    def __getitem__(self, i: int):
        if self._values is not None:
            return self._values[i]
        off, n = self._starts[i]
        try:
            return bytes(self._buf[off:off + n]).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _fail(self._path, f"metadata {self.key!r} element {i} is not UTF-8 ({e.reason})") from None

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def tolist(self) -> list:
        return [v.tolist() if isinstance(v, (GGUFArray, np.ndarray)) else v for v in self]

    def __repr__(self) -> str:
        return f"GGUFArray({self.key!r}, {VALUE_TYPES[self.elem_type][0]} x {len(self)})"


@dataclass
class TensorInfo:
    name: str
    #: ggml's order, innermost first: a matrix [N, K] of transformers is (K, N)
    dims: tuple[int, ...]
    type_id: int
    #: from the data start
    offset: int
    nbytes: int
    #: where its info record starts in the file
    info_at: int
    #: its raw bytes (uint8, a view of the memory-mapped file)
    data: np.ndarray = field(repr=False, default=None)

    @property
    def type_name(self) -> str:
        return TENSOR_TYPES[self.type_id][0]

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.dims, dtype=object))


@dataclass
class GGUFFile:
    path: Path
    version: int
    #: values: int, float, bool, str; numeric arrays as numpy arrays (views of the file); arrays of
    #: strings (or of arrays) as :class:`GGUFArray`
    metadata: dict[str, Any]
    #: value type ids of the metadata entries (arrays: (9, element type))
    value_types: dict[str, Any]
    tensors: dict[str, TensorInfo]
    alignment: int
    data_start: int
    size: int
    buf: np.ndarray = field(repr=False, default=None)

    def fail(self, message: str, tensor: str | None = None) -> FormatError:
        return _fail(self.path, message, tensor)


class _Cursor:
    def __init__(self, mm, size: int, path):
        self.mm, self.size, self.path, self.pos = mm, size, path, 0

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise _fail(self.path, f"{what} runs past the end of the file ({n} bytes at byte {self.pos} of "
                                   f"{self.size})")
        p = self.pos
        self.pos += n
        return p

    def unpack(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.mm, self.need(struct.calcsize(fmt), what))[0]

    def raw_string(self, what: str) -> tuple[int, int]:
        n = self.unpack("<Q", f"the length of {what}")
        return self.need(n, f"{what} ({n} bytes long)"), n

    def string(self, what: str) -> str:
        off, n = self.raw_string(what)
        try:
            return self.mm[off:off + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise _fail(self.path, f"{what} is not UTF-8 ({e.reason})") from None


def _value(cur: _Cursor, vtype: int, key: str, buf: np.ndarray, depth: int = 0):
    if vtype not in VALUE_TYPES:
        raise _fail(cur.path, f"metadata {key!r} has an unknown value type {vtype}")
    name, fmt = VALUE_TYPES[vtype]
    if fmt is not None:
        v = cur.unpack(fmt, f"metadata {key!r}")
        if vtype == 7:
            if v not in (0, 1):
                raise _fail(cur.path, f"metadata {key!r} is a bool of byte value {v}")
            return bool(v)
        return v
    if vtype == 8:
        return cur.string(f"metadata {key!r}")
    # an array
    if depth >= MAX_NESTING:
        raise _fail(cur.path, f"metadata {key!r} nests arrays more than {MAX_NESTING} deep")
    etype = cur.unpack("<I", f"metadata {key!r}'s element type")
    count = cur.unpack("<Q", f"metadata {key!r}'s element count")
    if etype not in VALUE_TYPES:
        raise _fail(cur.path, f"metadata {key!r} is an array of an unknown value type {etype}")
    ename, efmt = VALUE_TYPES[etype]
    if efmt is not None:
        size = struct.calcsize(efmt)
        off = cur.need(count * size, f"metadata {key!r} ({count} {ename} values)")
        a = buf[off:off + count * size].view(_NUMPY[etype])
        if etype == 7:
            if count and int(a.max()) > 1:
                raise _fail(cur.path, f"metadata {key!r} holds a bool of byte value {int(a.max())}")
            a = a.view(np.bool_)
        return a
    least = 8 if etype == 8 else 12  # a string's length, an array's type and count
    if count * least > cur.size - cur.pos:
        raise _fail(cur.path, f"metadata {key!r} claims {count} {ename} elements, more than the "
                              f"{cur.size - cur.pos} bytes left in the file hold")
    if etype == 8:
        starts = []
        unpack, size, mm = struct.unpack_from, cur.size, cur.mm
        pos = cur.pos
        for i in range(count):
            if pos + 8 > size:
                cur.pos = pos
                cur.need(8, f"the length of metadata {key!r} element {i}")
            n = unpack("<Q", mm, pos)[0]
            if pos + 8 + n > size:
                raise _fail(cur.path, f"metadata {key!r} element {i} ({n} bytes long) runs past the end of the file "
                                      f"(at byte {pos + 8} of {size})")
            starts.append((pos + 8, n))
            pos += 8 + n
        cur.pos = pos
        return GGUFArray(buf, cur.path, key, etype, starts)
    values = [_value(cur, etype, f"{key}[{i}]", buf, depth + 1) for i in range(count)]
    return GGUFArray(buf, cur.path, key, etype, [], values)


def _tensor_info(cur: _Cursor, path: Path, i: int, alignment: int, size: int) -> TensorInfo:
    """Tensor info ``i`` at the cursor: its name, dimensions, type and offset, each checked."""
    at = cur.pos
    name = cur.string(f"the name of tensor {i}")
    n_dims = cur.unpack("<I", f"tensor {name!r}'s dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _fail(path, f"{n_dims} dimensions (1 to {MAX_DIMS} are read)", name)
    dims = tuple(cur.unpack("<Q", f"tensor {name!r}'s dimensions") for _ in range(n_dims))
    type_id = cur.unpack("<I", f"tensor {name!r}'s type")
    offset = cur.unpack("<Q", f"tensor {name!r}'s offset")
    if type_id not in TENSOR_TYPES:
        raise _fail(path, f"an unknown tensor type {type_id}", name)
    tname, block, bsize = TENSOR_TYPES[type_id]
    if any(d == 0 for d in dims):
        raise _fail(path, f"a dimension of 0 in {list(dims)}", name)
    if dims[0] % block:
        raise _fail(path, f"its rows of {dims[0]} values are not whole {tname} blocks of {block}", name)
    n = 1
    for d in dims:
        n *= d
    nbytes = n // block * bsize
    if nbytes > size:
        raise _fail(path, f"dimensions {list(dims)} of {tname} make {nbytes} bytes, more than the file's {size}",
                    name)
    if offset % alignment:
        raise _fail(path, f"its offset {offset} is not a multiple of the alignment {alignment}", name)
    return TensorInfo(name, dims, type_id, offset, nbytes, at)


def read_gguf(path: Path | str) -> GGUFFile:
    """The header, metadata and tensor infos of a GGUF file, its data memory-mapped (each tensor's
    raw bytes a read-only numpy view). Every inconsistency refuses with a :class:`FormatError`."""
    path = Path(path)
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise _fail(path, "an empty file, not a GGUF file") from None
    size = len(mm)
    buf = np.frombuffer(mm, dtype=np.uint8)
    cur = _Cursor(mm, size, path)
    if size < 24 or mm[:4] != MAGIC:
        raise _fail(path, f"not a GGUF file (it starts with {bytes(mm[:4])!r}, not {MAGIC!r}; {size} bytes)")
    cur.pos = 4
    version = cur.unpack("<I", "the version")
    if version not in VERSIONS:
        if struct.unpack(">I", struct.pack("<I", version))[0] in VERSIONS:
            raise _fail(path, "a big-endian GGUF file; the native runtime reads little-endian ones")
        raise _fail(path, f"GGUF version {version}; versions {' and '.join(map(str, VERSIONS))} are read")
    n_tensors = cur.unpack("<Q", "the tensor count")
    n_kv = cur.unpack("<Q", "the metadata count")
    # a metadata entry takes at least 13 bytes (key length, value type, a byte), a tensor info 24
    if n_kv * 13 > size - cur.pos or n_tensors * 24 > size - cur.pos:
        raise _fail(path, f"its header claims {n_tensors} tensors and {n_kv} metadata entries, more than its "
                          f"{size} bytes can hold")
    metadata: dict[str, Any] = {}
    value_types: dict[str, Any] = {}
    for i in range(n_kv):
        key = cur.string(f"the key of metadata entry {i}")
        if key in metadata:
            raise _fail(path, f"metadata {key!r} appears twice")
        vtype = cur.unpack("<I", f"metadata {key!r}'s value type")
        at = cur.pos
        metadata[key] = _value(cur, vtype, key, buf)
        value_types[key] = (vtype, struct.unpack_from("<I", mm, at)[0]) if vtype == 9 else vtype
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or value_types.get("general.alignment", 4) != 4
            or alignment <= 0 or alignment & (alignment - 1) or alignment > 1 << 24):
        raise _fail(path, f"general.alignment {alignment!r} is not a uint32 power of two")
    infos: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(n_tensors):
        t = _tensor_info(cur, path, i, alignment, size)
        if t.name in names:
            raise _fail(path, "appears twice among the tensors", t.name)
        names.add(t.name)
        infos.append(t)
    data_start = -(-cur.pos // alignment) * alignment
    for t in infos:
        end = data_start + t.offset + t.nbytes
        if end > size:
            raise _fail(path, f"its {t.nbytes} bytes at byte {data_start + t.offset} run past the end of the file "
                              f"({size} bytes): a truncated or damaged file", t.name)
        t.data = buf[data_start + t.offset:end]
    ordered = sorted(infos, key=lambda t: (t.offset, t.nbytes))
    for a, b in zip(ordered, ordered[1:]):
        if a.offset + a.nbytes > b.offset:
            raise _fail(path, f"its bytes {a.offset}..{a.offset + a.nbytes} (from the data start) overlap those of "
                              f"{b.name!r} from {b.offset}", a.name)
    return GGUFFile(path, version, metadata, value_types, {t.name: t for t in infos}, alignment, data_start, size, buf)
