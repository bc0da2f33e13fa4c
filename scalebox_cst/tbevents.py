"""TensorBoard event files of scalars, written without tensorboardX.

The executor tails every run's metrics into ``.scalebox/tensorboard/`` (runner.execution). Doing
that with tensorboardX cost the host process 1.7 s of CPU per ``scalebox run``: importing
``tensorboardX`` imports torch (its writer module does) and protobuf. Scalars need none of it:
an event file is a sequence of TFRecords (``uint64 length``, ``uint32 masked crc32c(length)``,
data, ``uint32 masked crc32c(data)``, little-endian), each holding an ``Event`` protocol buffer:
``wall_time`` (field 1, double), ``step`` (2, int64), ``file_version`` (3, string, first record)
or ``summary`` (5): a ``Summary`` of ``Value`` s with ``tag`` (1, string) and ``simple_value``
(2, float). That is what this module writes, byte for byte as tensorboardX's ``add_scalar``
(tags cleaned the same way); TensorBoard and tensorboardX read it back.
"""
from __future__ import annotations

import math
import os
import re
import socket
import struct
import time
from typing import BinaryIO, Iterable, Optional, Tuple

from scalebox_cst import statedir

_INVALID_TAG = re.compile(r"[^-/\w\.]")


def _crc32c_table() -> Tuple[int, ...]:
    table = []
    for n in range(256):
        crc = n
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of TFRecords."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord around ``data``."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def _varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF  # int64: a negative step is ten bytes of two's complement
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # beyond float32: infinite, as numpy's float32 conversion makes it
        return struct.pack("<f", math.copysign(math.inf, value))


def clean_tag(name: str) -> str:
    """tensorboardX's tag cleaning: characters outside ``[-/\\w.]`` become ``_``, no leading ``/``."""
    return _INVALID_TAG.sub("_", name).lstrip("/")


def _scalar_field(key: bytes, packed: bytes) -> bytes:
    return key + packed if packed.strip(b"\0") else b""  # proto3: a zero (all-zero bits) is left out


def scalar_event(tag: str, value: float, step: int, wall_time: float) -> bytes:
    """The ``Event`` bytes of one scalar (as tensorboardX's ``add_scalar`` writes it)."""
    name = clean_tag(tag).encode("utf-8")
    summary_value = (_bytes_field(1, name) if name else b"") + b"\x15" + _float32(float(value))  # in a oneof: always written
    summary = _bytes_field(1, summary_value)
    step_field = b"\x10" + _varint(int(step)) if int(step) else b""
    return _scalar_field(b"\x09", struct.pack("<d", wall_time)) + step_field + _bytes_field(5, summary)


def version_event(wall_time: float) -> bytes:
    return _scalar_field(b"\x09", struct.pack("<d", wall_time)) + _bytes_field(3, b"brain.Event:2")


class ScalarWriter:
    """Appends scalars to a new event file in ``logdir`` (made at once and named as tensorboardX's
    ``SummaryWriter`` names it; OSError if it cannot be); each :meth:`add` batch is one write, flushed."""

    def __init__(self, logdir: str) -> None:
        statedir.makedirs(logdir)
        now = time.time()
        self.path = os.path.join(logdir, f"events.out.tfevents.{str(now)[:10]}.{socket.gethostname()}")
        fd = statedir.open_in_place(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._fh: Optional[BinaryIO] = os.fdopen(fd, "ab")
        self._fh.write(record(version_event(now)))
        self._fh.flush()

    def add(self, points: Iterable[Tuple[str, float, int, Optional[float]]]) -> int:
        """``(tag, value, step, wall_time or None)`` each; returns how many were written."""
        records = [record(scalar_event(tag, value, step, wall or time.time())) for tag, value, step, wall in points]
        if records and self._fh is not None:
            self._fh.write(b"".join(records))
            self._fh.flush()
        return len(records)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
