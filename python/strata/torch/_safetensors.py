"""The safetensors format, read in bounded chunks: a file's header, and each tensor as a weight source.

A safetensors file is an 8-byte little-endian header length n, n bytes of JSON (tensor name -> {"dtype", "shape",
"data_offsets": [begin, end)} with offsets from the byte after the header, and an optional "__metadata__" of
strings), then the data. The header is all that is read at first; a tensor's bytes are read with os.pread, at most
CHUNK_BYTES at a time, and converted by torch into the caller's tensor, so that reading a tensor of any size holds
one chunk of it in memory. The safetensors package is not needed (its load_file and safe_open read or map whole
tensors).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, Tuple

import torch

from ..errors import CorruptError, IOFailure, NotFound

# The most a read holds at once, in bytes of the file; read at each call, so a test can make it small.
CHUNK_BYTES = 16 << 20
# safetensors' own limit on the header: a larger length is a corrupt (or not a safetensors) file.
MAX_HEADER_BYTES = 100 << 20

DTYPES: Dict[str, torch.dtype] = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
                                  "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
                                  "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}
FLOATS = ("F32", "F16", "BF16", "F64")  # what a floating-point tensor (every parameter) takes


@dataclass(frozen=True)
class Entry:
    """Where one tensor lies: its file, dtype (the format's string), shape, and its bytes [start, start + nbytes)
    counted from the start of the file, which has file_bytes bytes."""

    name: str
    path: str
    dtype: str
    shape: Tuple[int, ...]
    start: int
    nbytes: int
    file_bytes: int

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def truncated(self) -> bool:
        return self.start + self.nbytes > self.file_bytes


def _pread_into(fd: int, buf: memoryview, offset: int) -> int:
    """Fills buf from offset of the file; the bytes read, fewer than len(buf) only where the file ends."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def _pread_all(fd: int, nbytes: int, offset: int) -> bytes:
    buf = bytearray(nbytes)
    return bytes(buf[:_pread_into(fd, memoryview(buf), offset)])


def _corrupt(path: str, what: str) -> CorruptError:
    return CorruptError("safetensors %s: %s; hint: the file is damaged or not a safetensors file: save it again "
                        "(save_pretrained, safetensors.torch.save_file)" % (path, what))


def read_header(path: str) -> Dict[str, Entry]:
    """Every tensor of the file at path, by name (its __metadata__ left out). Raises NotFound or IOFailure when the
    file cannot be read, CorruptError naming the file (and the tensor) when its header is malformed. A tensor whose
    bytes lie past the end of the file is listed: Entry.truncated() says so, and whoever uses it refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise NotFound("safetensors %s: no such file" % path) from None
    except OSError as e:
        raise IOFailure("safetensors %s: cannot open: %s" % (path, e.strerror or e)) from None
    try:
        file_bytes = os.fstat(fd).st_size
        head = _pread_all(fd, 8, 0)
        if len(head) < 8:
            raise _corrupt(path, "%d bytes, shorter than the 8-byte header length" % file_bytes)
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES or 8 + n > file_bytes:
            raise _corrupt(path, "the header length is %d bytes, but the file has %d and a header is at most %d"
                           % (n, file_bytes, MAX_HEADER_BYTES))
        text = _pread_all(fd, n, 8)
    except OSError as e:
        raise IOFailure("safetensors %s: cannot read: %s" % (path, e.strerror or e)) from None
    finally:
        os.close(fd)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _corrupt(path, "the header is not JSON (%s)" % e) from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is a JSON %s, not an object of tensors" % type(header).__name__)
    return {name: _entry(path, name, info, 8 + n, file_bytes) for name, info in header.items()
            if name != "__metadata__"}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _entry(path: str, name: str, info: Any, data_start: int, file_bytes: int) -> Entry:
    if not isinstance(info, dict) or not isinstance(info.get("dtype"), str):
        raise _corrupt(path, "tensor %s: the header gives no dtype (%r)" % (name, info))
    shape, offsets = info.get("shape"), info.get("data_offsets")
    if not isinstance(shape, list) or not all(_is_int(d) for d in shape):
        raise _corrupt(path, "tensor %s: shape %r is not a list of sizes" % (name, shape))
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(v) for v in offsets) \
            or offsets[0] > offsets[1]:
        raise _corrupt(path, "tensor %s: data_offsets %r is not [begin, end) with 0 <= begin <= end"
                       % (name, offsets))
    e = Entry(name, path, info["dtype"], tuple(shape), data_start + offsets[0], offsets[1] - offsets[0], file_bytes)
    dtype = DTYPES.get(e.dtype)
    if dtype is not None and e.nbytes != e.numel() * _itemsize(dtype):
        raise _corrupt(path, "tensor %s: %s of shape %s takes %d bytes, but data_offsets %r hold %d"
                       % (name, e.dtype, list(e.shape), e.numel() * _itemsize(dtype), offsets, e.nbytes))
    return e


def _itemsize(dtype: torch.dtype) -> int:
    size: int = torch.empty(0, dtype=dtype).element_size()
    return size


class FileTensor:
    """A tensor of a safetensors file as a weight source (strata.torch._sources): read_into converts the stored
    dtype to out's. The file is opened at each read, so a source holds no descriptor while it waits for initialize."""

    def __init__(self, entry: Entry) -> None:
        self.entry = entry
        self.dtype = DTYPES[entry.dtype]
        self.itemsize = _itemsize(self.dtype)

    def describe(self) -> str:
        return "%s in %s" % (self.entry.name, self.entry.path)

    def read_into(self, offset: int, count: int, out: torch.Tensor) -> None:
        """Elements [offset, offset + count) of the tensor, flattened, into out (1-D, count elements, any dtype
        torch converts to: fp32 for strata's tiers, a parameter's own dtype for a copy), CHUNK_BYTES at a time."""
        e = self.entry
        if offset < 0 or count < 0 or offset + count > e.numel() or out.numel() != count:
            raise IOFailure("safetensors: %s: elements [%d, %d) asked into %d, but the tensor has %d"
                            % (self.describe(), offset, offset + count, out.numel(), e.numel()))
        if count == 0:
            return
        step = max(1, CHUNK_BYTES // self.itemsize)
        try:
            fd = os.open(e.path, os.O_RDONLY)
        except OSError as err:
            raise IOFailure("safetensors: %s: cannot open: %s; hint: the file must stay where it was until "
                            "strata.torch.initialize has read it" % (self.describe(), err.strerror or err)) from None
        try:
            buf = bytearray(min(step, count) * self.itemsize)  # the one chunk this read holds
            done = 0
            while done < count:
                n = min(step, count - done)
                at = e.start + (offset + done) * self.itemsize
                got = _pread_into(fd, memoryview(buf)[:n * self.itemsize], at)
                if got != n * self.itemsize:
                    raise CorruptError("safetensors: %s: the file ends at byte %d, inside the tensor (bytes [%d, %d)"
                                       "); hint: it was truncated or changed after it was opened"
                                       % (self.describe(), at + got, e.start, e.start + e.nbytes))
                with torch.no_grad():
                    out[done:done + n].copy_(torch.frombuffer(buf, dtype=self.dtype, count=n))
                done += n
        except OSError as err:
            raise IOFailure("safetensors: %s: cannot read: %s" % (self.describe(), err.strerror or err)) from None
        finally:
            os.close(fd)
