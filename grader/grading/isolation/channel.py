"""Framing of the messages between the grader and its worker: length-prefixed ``torch.save`` records on
a pipe of their own (never stdout, which belongs to the student's prints).

Records are read back with ``torch.load(weights_only=True)``: only tensors and plain containers (dict,
list, str, numbers) are accepted, so nothing the worker sends can make the grader import or run code.
What the records mean is :mod:`grader.grading.isolation.protocol`'s business.
"""

from __future__ import annotations

import io
import os
import struct
from typing import Any, BinaryIO

import torch

MAGIC = b"GRv2"
_HEADER = struct.Struct(">4sQ")  # magic, payload length


class ChannelError(Exception):
    """The stream holds something that is not a record (the message says what)."""


def write_record(fd: int, record: dict[str, Any]) -> None:
    """Write one record (a dict of plain data and tensors) to ``fd``."""
    buf = io.BytesIO()
    torch.save(record, buf)
    data = _HEADER.pack(MAGIC, buf.getbuffer().nbytes) + buf.getvalue()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_record(stream: BinaryIO, *, max_bytes: int | None = None) -> dict[str, Any] | None:
    """The next record, or None at a clean end of the stream. A torn record, bytes that are not a record,
    or a record over ``max_bytes`` raise :class:`ChannelError`."""
    header = _read_exactly(stream, _HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise ChannelError("the channel ends in a torn record")
    magic, length = _HEADER.unpack(header)
    if magic != MAGIC:
        raise ChannelError("the channel holds unexpected bytes")
    if max_bytes is not None and length > max_bytes:
        raise ChannelError(f"a record of {length / 2**20:.0f} MB is larger than the {max_bytes / 2**20:.0f} MB allowed")
    payload = _read_exactly(stream, length)
    if len(payload) < length:
        raise ChannelError("the channel ends in a torn record")
    try:
        record = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:
        raise ChannelError(f"a record is not valid data ({type(exc).__name__})") from None
    if not isinstance(record, dict) or not isinstance(record.get("type"), str):
        raise ChannelError("a record is not a message")
    return record
