"""The batch's reference store: each hidden case's inputs and float64 reference outputs, computed once per
batch and shared by every student of it (local workers and Slurm array tasks alike).

A case is the same for every student of a batch (its shapes, dtypes and values come from the batch's secret or
the course's ``cases_seed``), so its inputs and its reference are too: the first run that needs them computes and
stores them, every later run loads them. The store lives in the output folder (``OUT/staff/references``), which
no sandbox ever shows to student code.

Every record is signed: an HMAC-SHA256, keyed by the batch's secret, over the record's identity (the exercise,
the part, the case, the source of the module that defines the part's reference and the torch version that computed
it) and its bytes. A record that was changed, truncated, or copied from another batch (another secret) fails the
check: it is refused by name (a warning, and :attr:`ReferenceStore.refused`) and computed again, never used.

A record stored or read once is kept in the grader's memory (:data:`KEPT_BYTES` of the latest, per store) while its
file is unchanged: every student of a batch runs the same cases, and reading, checking and unpickling a FlashAttention
record again for each took seconds of the grader's CPU per student. What :meth:`ReferenceStore.load` returns is that
record itself, shared by every run of the process: it is only read (sent to a worker, compared with), never changed.

A case's inputs are drawn once too: runs that need them before anyone stored the case's record (the batch's first
students, side by side) share the inputs the first of them drew (kept in memory, :data:`DRAWN_BYTES` of the latest,
until the record is stored), or wait while it draws them. A FlashAttention run draws about 8 s of inputs on one core,
its speed rechecks' hundreds of megabytes most of that.

Runs that need a record nobody stored yet compute it once: within a process they wait for the run computing it;
across processes (a batch split over one grader process per GPU, Slurm array tasks on a shared folder) each
computation holds a lock file beside the record (``flock``), and a process that finds it held waits, then loads
what the other stored. Where the filesystem has no such locks (or one is held too long), each process computes its own.

An exercise run sees the store through :class:`~.case_references.CaseReferences`.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import hmac
import inspect
import io
import json
import os
import stat
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from grader.checks.spec import Case, Inputs, Part

MAC_BYTES = 32
# Records kept in memory once stored or read, in bytes of their tensors, the latest first. The largest, a
# FlashAttention speed recheck's, is 670 MB; a batch grades one exercise's runs side by side, so the records asked
# for again are among the latest.
KEPT_BYTES = 2 << 30
# Inputs drawn and not stored in a record yet, kept for the runs that need them meanwhile, in bytes, the latest first.
DRAWN_BYTES = 1 << 30
DRAW_WAIT_S = 600.0  # the longest a run waits for another's drawing before drawing its own

Record = tuple[Inputs, dict[str, torch.Tensor]]  # a case's inputs and its reference outputs
Compute = Callable[[Part, Inputs], dict[str, Any]]  # how a reference is computed: on the CPU, or a GPU's


def _on_cpu(part: Part, inputs: Inputs) -> dict[str, Any]:
    return part.reference(inputs)


def _spec_fingerprint(part: Part) -> str:
    """The source of the module that defines the part's reference (a changed reference is a new record)."""
    module = inspect.getmodule(part.reference)
    return _source_digest(module.__name__ if module is not None else repr(part.reference))


@functools.cache
def _source_digest(name: str) -> str:
    """Read once per process: the spec cannot change while the grader runs."""
    module = sys.modules.get(name)
    try:
        source = inspect.getsource(module) if module is not None else name
    except (OSError, TypeError):
        source = name
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@dataclass
class ReferenceStore:
    """Inputs and reference outputs per case, in ``folder``, signed with ``secret``. ``folder`` None: nothing is
    stored (every run computes its own, as ``pytest`` and ``grader bench`` do)."""

    folder: Path | None
    secret: str
    refused: list[str] = field(default_factory=list)  # records that failed their check, by name
    reads: int = 0  # records read from their files (the others came from memory)
    drawn: int = 0  # inputs drawn for cases no record held (the others' came from a record or another run's draw)
    kept_bytes: int = KEPT_BYTES
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _computing: dict[Path, threading.Event] = field(default_factory=dict, repr=False)  # in this process, now
    _refused_names: set[str] = field(default_factory=set, repr=False)
    # path -> (the file's inode, size and mtime when read, the record, its bytes): the latest last
    _kept: OrderedDict[Path, tuple[tuple[int, int, int], Record, int]] = field(default_factory=OrderedDict,
                                                                              repr=False)
    _kept_total: int = field(default=0, repr=False)
    _drawing: dict[Path, threading.Event] = field(default_factory=dict, repr=False)  # inputs being drawn, now
    _drawn: OrderedDict[Path, tuple[Inputs, int]] = field(default_factory=OrderedDict, repr=False)  # latest last
    _drawn_total: int = field(default=0, repr=False)

    # ------------------------------------------------------------------------------------------ names

    def _identity(self, exercise: str, part: Part, case: Case) -> str:
        return json.dumps({"exercise": exercise, "part": part.name, "case": case.to_dict(),
                           "spec": _spec_fingerprint(part), "torch": torch.__version__}, sort_keys=True, default=str)

    def path(self, exercise: str, part: Part, case: Case) -> Path | None:
        if self.folder is None:
            return None
        digest = hashlib.sha256(self._identity(exercise, part, case).encode()).hexdigest()[:32]
        return self.folder / exercise / part.name / f"{digest}.pt"

    def _mac(self, identity: str, payload: bytes | memoryview) -> bytes:
        # over identity, a NUL and the payload, fed in pieces: a FlashAttention speed recheck's record is hundreds
        # of megabytes, and copying it into one string holds the grader's one interpreter while it copies (hashing
        # a large buffer does not)
        mac = hmac.new(self.secret.encode(), identity.encode() + b"\0", hashlib.sha256)
        mac.update(payload)
        return mac.digest()

    # ------------------------------------------------------------------------------------------ records

    def load(self, exercise: str, part: Part, case: Case) -> Record | None:
        """The stored inputs and reference of ``case``, or None (not stored yet, or refused). Shared: never
        change them in place."""
        path = self.path(exercise, part, case)
        if path is None:
            return None
        try:
            info = path.stat()
        except OSError:
            return None
        if not stat.S_ISREG(info.st_mode):
            return None
        name = f"{exercise}/{part.name}/{path.name}"
        version = (info.st_ino, info.st_size, info.st_mtime_ns)
        with self._lock:
            if name in self._refused_names:  # said once; computed again and overwritten by the run that refused it
                return None
            kept = self._kept.get(path)
            if kept is not None and kept[0] == version:
                self._kept.move_to_end(path)
                return kept[1]
        record = self._read(path, name, exercise, part, case)
        if record is not None:
            self._keep(path, version, record)
        return record

    def _read(self, path: Path, name: str, exercise: str, part: Part, case: Case) -> Record | None:
        with self._lock:
            self.reads += 1
        try:
            blob = path.read_bytes()
        except OSError as exc:
            self._refuse(name, f"cannot be read ({exc})")
            return None
        mac, payload = blob[:MAC_BYTES], memoryview(blob)[MAC_BYTES:]
        if len(mac) != MAC_BYTES or not hmac.compare_digest(mac, self._mac(self._identity(exercise, part, case),
                                                                           payload)):
            self._refuse(name, "its signature does not match this batch (changed, truncated, or from another batch)")
            return None
        try:
            record = torch.load(io.BytesIO(payload), weights_only=True)
            inputs, expected = record["inputs"], record["expected"]
        except Exception as exc:  # signed by us, yet unreadable: refuse it all the same
            self._refuse(name, f"cannot be read ({type(exc).__name__}: {exc})")
            return None
        return inputs, expected

    def _keep(self, path: Path, version: tuple[int, int, int], record: Record) -> None:
        size = _nbytes(record)
        with self._lock:
            old = self._kept.pop(path, None)
            if old is not None:
                self._kept_total -= old[2]
            if size > self.kept_bytes:
                return
            self._kept[path] = (version, record, size)
            self._kept_total += size
            while self._kept_total > self.kept_bytes:
                _, (_, _, dropped) = self._kept.popitem(last=False)
                self._kept_total -= dropped

    def draw(self, exercise: str, part: Part, case: Case) -> tuple[Inputs, dict[str, torch.Tensor] | None]:
        """The inputs of a case no record held: those another run of this process drew (waiting while it draws
        them), else drawn here and kept for the others until the case's record is stored; with the case's
        reference where its record was stored meanwhile. Shared: never change them in place."""
        path = self.path(exercise, part, case)
        if path is None:
            return part.make_inputs(case), None
        with self._lock:
            drawn = self._drawn.get(path)
            if drawn is not None:
                self._drawn.move_to_end(path)
                return drawn[0], None
            running = self._drawing.get(path)
            if running is None:
                self._drawing[path] = threading.Event()
        if running is not None:
            running.wait(DRAW_WAIT_S)
            found = self.load(exercise, part, case)
            if found is not None:
                return found
            with self._lock:
                drawn = self._drawn.get(path)
            # else its drawing failed (this one meets the same error) or the memory dropped it: drawn again
            return (drawn[0], None) if drawn is not None else (self._make(part, case), None)
        try:
            inputs = self._make(part, case)
            self._keep_drawn(path, inputs)
            return inputs, None
        finally:
            with self._lock:
                self._drawing.pop(path).set()

    def _make(self, part: Part, case: Case) -> Inputs:
        inputs = part.make_inputs(case)
        with self._lock:
            self.drawn += 1
        return inputs

    def _keep_drawn(self, path: Path, inputs: Inputs) -> None:
        size = _nbytes((inputs,))
        with self._lock:
            if size > DRAWN_BYTES:
                return
            self._drawn[path] = (inputs, size)
            self._drawn_total += size
            while self._drawn_total > DRAWN_BYTES:
                _, (_, dropped) = self._drawn.popitem(last=False)
                self._drawn_total -= dropped

    def save(self, exercise: str, part: Part, case: Case, inputs: Inputs,
             expected: dict[str, torch.Tensor]) -> None:
        path = self.path(exercise, part, case)
        if path is None:
            return
        with self._lock:
            self._refused_names.discard(f"{exercise}/{part.name}/{path.name}")  # replaced by a good record
        buffer = io.BytesIO()
        torch.save({"inputs": inputs, "expected": expected}, buffer)
        payload = buffer.getbuffer()  # not copied: signed and written as it is
        mac = self._mac(self._identity(exercise, part, case), payload)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                f.write(mac)
                f.write(payload)
            os.replace(tmp, path)  # atomic: a concurrent reader sees the whole record or none
            info = path.stat()
        except OSError as exc:  # a full disk costs time (the next run computes it again), never a grade
            print(f"grader: could not store a reference ({exc})", file=sys.stderr)
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(tmp)
            return
        self._keep(path, (info.st_ino, info.st_size, info.st_mtime_ns), (inputs, expected))
        with self._lock:  # the record holds them now
            _, size = self._drawn.pop(path, (None, 0))
            self._drawn_total -= size

    def reference(self, exercise: str, part: Part, case: Case, inputs: Inputs, *,
                  compute: Compute | None = None) -> tuple[dict[str, Any], bool]:
        """The reference of ``case`` (computed from ``inputs`` by ``compute``, ``part.reference`` by default):
        stored, or computed and stored; and whether it was computed here. Runs that need the same case at once
        compute it once: the others wait for it, in this process and in others sharing the folder (a computation
        holds one lock and never waits for another, so no two runs wait for each other)."""
        compute = compute or _on_cpu
        path = self.path(exercise, part, case)
        if path is None:
            return compute(part, inputs), True
        while True:
            found = self.load(exercise, part, case)
            if found is not None:
                return found[1], False
            with self._lock:
                running = self._computing.get(path)
                if running is None:
                    self._computing[path] = threading.Event()
            if running is None:
                break
            running.wait(600.0)  # then load what it stored (or compute, if it failed)
        try:
            with _held(path):
                found = self.load(exercise, part, case)  # stored by another process while this one waited
                if found is not None:
                    return found[1], False
                expected = compute(part, inputs)
                self.save(exercise, part, case, inputs, expected)
                return expected, True
        finally:
            with self._lock:
                self._computing.pop(path).set()

    def _refuse(self, name: str, why: str) -> None:
        with self._lock:
            self.refused.append(f"{name}: {why}")
            self._refused_names.add(name)
        print(f"grader: refused the stored reference {name}: {why}; computing it again", file=sys.stderr)


def _nbytes(record: tuple[dict[str, Any], ...]) -> int:
    """The bytes of a record's (or inputs') tensors (a storage that several views share counted once)."""
    storages = {}
    for values in record:
        for value in values.values():
            if isinstance(value, torch.Tensor):
                storage = value.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


LOCK_WAIT_S = 120.0  # the longest a process waits for another's computation (or a stale NFS lock) before computing
LOCK_POLL_S = 0.05


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """The record's lock file held (``flock``, across processes) while the block runs; the block runs unlocked
    where the filesystem has no locks or the holder has not finished within :data:`LOCK_WAIT_S`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(LOCK_POLL_S)
            except OSError:  # no locks on this filesystem
                break
        yield
    finally:
        os.close(fd)  # and its lock with it


def local(secret: str = "") -> ReferenceStore:
    """A store that keeps nothing: every reference is computed (runs outside a batch folder)."""
    return ReferenceStore(None, secret)
