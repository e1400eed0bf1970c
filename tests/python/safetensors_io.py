#!/usr/bin/python3
"""A small pure-NumPy reader and writer of safetensors files.

Debian has no Python `safetensors` package, so the test scripts use this one.

The format: an 8-byte little-endian unsigned header length N, then N bytes of
UTF-8 JSON (padded with spaces so the data starts at a multiple of 8),

    {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
     "__metadata__": {"key": "string value"}}

then the tensor bytes, little-endian and C-ordered, with offsets relative to the
start of the data. BF16 tensors are NumPy uint16 arrays of the raw bit patterns.

Use from another script in tests/python or tests/e2e:

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # from tests/e2e
    import safetensors_io
    safetensors_io.save("x.safetensors", {"w": np.ones((2, 3), np.float32)}, metadata={"step": "0"})
    tensors, metadata = safetensors_io.load("x.safetensors")

Run it directly for a self-test.
"""
import json
import math
import os
import struct
import sys

import numpy as np

# safetensors dtype name -> little-endian NumPy dtype. mixtrain writes the first
# five; the rest are read and written so that files from PyTorch users load.
_DTYPES = {
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # raw bfloat16 bits
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "U16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "U64": np.dtype("<u8"),
    "BOOL": np.dtype("?"),
}

# NumPy kind+size -> safetensors name, for save(). uint16 means BF16 here (the
# convention of these tests); pass dtypes={name: "U16"} for a real uint16 tensor.
_FROM_NUMPY = {
    ("f", 4): "F32",
    ("f", 2): "F16",
    ("u", 2): "BF16",
    ("i", 4): "I32",
    ("i", 8): "I64",
    ("f", 8): "F64",
    ("i", 2): "I16",
    ("i", 1): "I8",
    ("u", 1): "U8",
    ("u", 4): "U32",
    ("u", 8): "U64",
    ("b", 1): "BOOL",
}

_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit


class SafetensorsError(ValueError):
    """A malformed file or an unsupported tensor; the message names the file."""


def dtype_name(array):
    """The safetensors dtype save() would write for this array."""
    a = np.asarray(array)
    key = (a.dtype.kind, a.dtype.itemsize)
    if key not in _FROM_NUMPY:
        raise SafetensorsError(f"no safetensors dtype for numpy dtype {a.dtype}")
    return _FROM_NUMPY[key]


def save(path, tensors, metadata=None, dtypes=None):
    """Writes `tensors` (name -> numpy array) to `path`.

    metadata: optional {str: str}, stored as "__metadata__".
    dtypes: optional {name: safetensors dtype} overriding the dtype inferred from
    the array (e.g. "U16" for a uint16 array that is not bfloat16). The array's
    bytes are written as they are, so the itemsize must match.
    Tensors are laid out by descending element size, then name (as the reference
    implementation does), which keeps every tensor naturally aligned.
    The file is written to `path + ".tmp"` and renamed over `path`.
    """
    dtypes = dict(dtypes or {})
    if not isinstance(tensors, dict):
        raise TypeError("tensors must be a dict of name -> numpy array")
    prepared = []
    for name, value in tensors.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise SafetensorsError(f"invalid tensor name {name!r}")
        a = np.asarray(value)
        st = dtypes.pop(name, None) or dtype_name(a)
        if st not in _DTYPES:
            raise SafetensorsError(f"tensor {name!r}: unknown safetensors dtype {st!r}")
        if _DTYPES[st].itemsize != a.dtype.itemsize:
            raise SafetensorsError(f"tensor {name!r}: dtype {st} does not fit numpy dtype {a.dtype}")
        a = np.asarray(a, order="C").astype(a.dtype.newbyteorder("<"), copy=False)  # keeps 0-d arrays 0-d
        prepared.append((name, st, a))
    if dtypes:
        raise SafetensorsError(f"dtypes given for unknown tensors: {sorted(dtypes)}")
    prepared.sort(key=lambda t: (-_DTYPES[t[1]].itemsize, t[0]))

    header = {}
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError(f"metadata must map str to str, got {k!r}: {v!r}")
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, st, a in prepared:
        header[name] = {"dtype": st, "shape": [int(d) for d in a.shape], "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)

    tmp = str(path) + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, _, a in prepared:
            f.write(a.tobytes(order="C"))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_header(path):
    """Returns (header dict without "__metadata__", metadata dict, data start offset)."""
    with open(path, "rb") as f:
        head = f.read(8)
        size = os.fstat(f.fileno()).st_size
        if len(head) < 8:
            raise SafetensorsError(f"{path}: too short for a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} does not fit the file ({size} bytes)")
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise SafetensorsError(f"{path}: __metadata__ must map strings to strings")
    return header, metadata, 8 + n


def load(path):
    """Reads `path`; returns (dict name -> numpy array, metadata dict).

    Arrays come in the file's offset order. BF16 tensors are uint16 arrays
    (bf16_to_f32 widens them). Raises SafetensorsError naming the file and the
    problem on a truncated or inconsistent file.
    """
    tensors, _, metadata = load_with_dtypes(path)
    return tensors, metadata


def load_with_dtypes(path):
    """Like load(), plus a dict name -> safetensors dtype name ("F16", "BF16", ...)."""
    header, metadata, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    entries = []
    for name, info in header.items():
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise SafetensorsError(f"{path}: tensor {name!r} needs dtype, shape and data_offsets")
        st, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if st not in _DTYPES:
            raise SafetensorsError(f"{path}: tensor {name!r} has unknown dtype {st!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise SafetensorsError(f"{path}: tensor {name!r} has invalid shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise SafetensorsError(f"{path}: tensor {name!r} has invalid data_offsets {offs!r}")
        begin, end = offs
        nbytes = math.prod(shape) * _DTYPES[st].itemsize
        if not 0 <= begin <= end or end - begin != nbytes:
            raise SafetensorsError(
                f"{path}: tensor {name!r} data_offsets {offs} do not hold {st} {shape} ({nbytes} bytes)")
        if end > len(data):
            raise SafetensorsError(
                f"{path}: tensor {name!r} ends at {end}, past the data ({len(data)} bytes): truncated?"
            )
        entries.append((begin, end, name, st, shape))
    entries.sort()
    # The reference implementation requires the tensors to tile the data exactly.
    pos = 0
    for begin, end, name, _, _ in entries:
        if begin != pos:
            raise SafetensorsError(f"{path}: tensor {name!r} starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    if pos != len(data):
        raise SafetensorsError(f"{path}: {len(data) - pos} bytes after the last tensor")

    tensors, dtypes = {}, {}
    for begin, end, name, st, shape in entries:
        a = np.frombuffer(data, dtype=_DTYPES[st], count=math.prod(shape), offset=begin).reshape(tuple(shape))
        tensors[name] = a.astype(a.dtype.newbyteorder("="))  # a native-order, writable copy
        dtypes[name] = st
    return tensors, dtypes, metadata


def bf16_to_f32(bits):
    """uint16 bfloat16 bit patterns -> float32 (exact)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x):
    """float32 -> uint16 bfloat16 bit patterns, round to nearest even; NaN stays a quiet NaN."""
    u = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, ((u >> 16) | 0x0040).astype(np.uint16), rounded)


def _self_test():
    import tempfile

    rng = np.random.default_rng(0)
    tensors = {
        "fc1.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "fc1.bias": rng.standard_normal(4).astype(np.float16),
        "emb.weight": f32_to_bf16(rng.standard_normal((2, 5)).astype(np.float32)),
        "labels": rng.integers(-(2**40), 2**40, size=7, dtype=np.int64),
        "idx": np.arange(5, dtype=np.int32),
        "scalar": np.array(3.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "strided": np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2].T,  # not contiguous
        "big_endian": np.arange(6, dtype=">i4").reshape(2, 3),
        "flags": np.array([True, False, True]),
    }
    meta = {"step": "12", "loss_scale": "32768", "note": "ünïcode ok"}
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "t.safetensors")
        save(p, tensors, metadata=meta)
        assert not os.path.exists(p + ".tmp")
        got, got_meta = load(p)
        assert got_meta == meta, got_meta
        assert set(got) == set(tensors), set(got) ^ set(tensors)
        for k, v in tensors.items():
            assert got[k].shape == v.shape, (k, got[k].shape, v.shape)
            assert np.array_equal(got[k], v), k
            assert got[k].dtype.newbyteorder("=") == v.dtype.newbyteorder("="), (k, got[k].dtype, v.dtype)
            assert got[k].flags.writeable, k
        _, dts, _ = load_with_dtypes(p)
        assert dts["emb.weight"] == "BF16" and dts["fc1.bias"] == "F16" and dts["labels"] == "I64", dts

        # Layout: u64 length, header padded with spaces to a multiple of 8, compact JSON.
        with open(p, "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        assert n % 8 == 0 and blob[8 : 8 + n].decode("utf-8").rstrip(" ").endswith("}")
        hdr, _, start = read_header(p)
        assert start == 8 + n and hdr["fc1.weight"]["dtype"] == "F32" and hdr["fc1.weight"]["shape"] == [4, 3]
        w = hdr["fc1.weight"]["data_offsets"]
        raw_w = np.frombuffer(blob[start + w[0] : start + w[1]], "<f4").reshape(4, 3)
        assert np.array_equal(raw_w, tensors["fc1.weight"])

        # A file written by hand, the way the reference implementation lays it out.
        hand = json.dumps({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode()
        hand += b" " * (-len(hand) % 8)
        q = os.path.join(d, "hand.safetensors")
        with open(q, "wb") as f:
            f.write(struct.pack("<Q", len(hand)) + hand + np.array([1.0, -2.0], "<f2").tobytes())
        got, got_meta = load(q)
        assert got_meta == {} and got["a"].dtype == np.float16 and got["a"].tolist() == [1.0, -2.0]

        # No metadata: no "__metadata__" key; an explicit U16 tensor stays U16.
        r = os.path.join(d, "nometa.safetensors")
        save(r, {"u": np.array([1, 2], np.uint16)}, dtypes={"u": "U16"})
        with open(r, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            assert "__metadata__" not in json.loads(f.read(n))
        assert load_with_dtypes(r)[1] == {"u": "U16"}

        # Only empty tensors: no data bytes at all.
        e = os.path.join(d, "empty.safetensors")
        save(e, {"z": np.zeros((3, 0), np.float16)})
        got, _ = load(e)
        assert got["z"].shape == (3, 0) and got["z"].dtype == np.float16

        # Broken files are errors that say so.
        broken = ((blob[:-3], "truncated"), (blob[:5], "too short"), (struct.pack("<Q", 10**9) + blob[8:], "length"))
        for bad, why in broken:
            t = os.path.join(d, "bad.safetensors")
            with open(t, "wb") as f:
                f.write(bad)
            try:
                load(t)
            except SafetensorsError as e:
                assert "bad.safetensors" in str(e), e
            else:
                raise AssertionError(f"{why} file loaded")

    # bfloat16 helpers: ties to even, overflow to inf, NaN kept.
    x = np.array([0x3F800000, 0x3F808000, 0x3F818000, 0x7F7F8000, 0x7F800000, 0x7FC00001], np.uint32).view(np.float32)
    b = f32_to_bf16(x)
    assert b[:5].tolist() == [0x3F80, 0x3F80, 0x3F82, 0x7F80, 0x7F80], [hex(v) for v in b]
    assert np.isnan(bf16_to_f32(b)[5]) and bf16_to_f32(b)[0] == 1.0
    print("safetensors_io self-test passed")


if __name__ == "__main__":
    _self_test()
    sys.exit(0)
