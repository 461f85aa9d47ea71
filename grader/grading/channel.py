"""The private channel from a worker to the verdict process: length-prefixed ``torch.save`` records.

The worker writes to a file descriptor it inherits (an unlinked temporary file the parent opened),
never to stdout, which belongs to the student's prints. The parent reads the records back with
``torch.load(weights_only=True)``: only tensors and plain containers (dict, list, str, numbers) are
accepted, so nothing the worker sends can make the parent import or run student code.
"""

from __future__ import annotations

import io
import os
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

MAGIC = b"GRv1"
_HEADER = struct.Struct(">4sQ")  # magic, payload length


def write_record(fd: int, record: dict[str, Any]) -> None:
    """Append one record (a dict of plain data and tensors) to ``fd``."""
    buf = io.BytesIO()
    torch.save(record, buf)
    data = _HEADER.pack(MAGIC, buf.getbuffer().nbytes) + buf.getvalue()
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@dataclass
class Decoded:
    records: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None  # why decoding stopped early, if it did


def read_records(data: bytes) -> Decoded:
    """Decode every complete record; a torn last record (the worker died mid-write) or bytes that are
    not a record end decoding with a ``problem`` and keep the records before it."""
    out = Decoded()
    pos = 0
    while pos < len(data):
        if len(data) - pos < _HEADER.size:
            out.problem = f"the result channel ends in a torn record after {len(out.records)} records"
            break
        magic, length = _HEADER.unpack_from(data, pos)
        if magic != MAGIC:
            out.problem = f"the result channel holds unexpected bytes after {len(out.records)} records"
            break
        start = pos + _HEADER.size
        if start + length > len(data):
            out.problem = f"the result channel ends in a torn record after {len(out.records)} records"
            break
        try:
            record = torch.load(io.BytesIO(data[start : start + length]), weights_only=True)
        except Exception as exc:
            out.problem = f"record {len(out.records)} on the result channel is not valid data ({type(exc).__name__})"
            break
        if not isinstance(record, dict) or not isinstance(record.get("type"), str):
            out.problem = f"record {len(out.records)} on the result channel is not a record"
            break
        out.records.append(record)
        pos = start + length
    return out
