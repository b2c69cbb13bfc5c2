"""Bounds-checked little-endian reading shared by the file loaders.

Every length or count read from a file is checked against the bytes that are actually left before
anything is allocated, so a truncated or bit-flipped file fails with a ValueError naming the file
and the field instead of crashing, hanging in a huge loop or allocating gigabytes.
"""
from __future__ import annotations

import struct


class BoundedReader:
    """Sequential reader over a bytes-like object that refuses to read past its end."""

    def __init__(self, buf: memoryview | bytes, what: str):
        self.buf = memoryview(buf)
        self.pos = 0
        self.what = what

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def fail(self, msg: str) -> "ValueError":
        return ValueError(f"{self.what}: {msg} (at byte {self.pos})")

    def take(self, n: int, field: str) -> memoryview:
        if n < 0 or n > self.left:
            raise self.fail(f"{field} needs {n} bytes but only {self.left} remain (truncated or corrupt file)")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def skip(self, n: int, field: str) -> None:
        self.take(n, field)

    def unpack(self, fmt: str, field: str):
        size = struct.calcsize(fmt)
        return struct.unpack("<" + fmt, self.take(size, field))[0]

    def count(self, fmt: str, field: str, min_item_bytes: int) -> int:
        """Read a count and check that that many items of at least min_item_bytes can still fit."""
        n = self.unpack(fmt, field)
        if n * min_item_bytes > self.left:
            raise self.fail(f"{field} = {n} cannot fit in the {self.left} bytes left")
        return n
