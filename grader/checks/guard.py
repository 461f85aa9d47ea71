"""Guard bands for interpreted launches: an out-of-bounds access becomes a clear error, not a crash.

In the Triton interpreter a kernel's pointers are raw host addresses, so a missing mask reads or
writes past the end of a tensor's memory and can abort the whole Python process (glibc: "malloc():
unaligned tcache chunk"). :func:`guarded_launch` copies each tensor argument's storage into the
middle of a larger buffer filled with a known byte pattern, launches on views of those copies,
copies the results back and checks that the pattern around each storage is intact.
"""

from __future__ import annotations

import torch

PATTERN = 0xA5
MIN_PAD_BYTES = 1 << 18


class OutOfBoundsError(RuntimeError):
    """A kernel stored outside the memory of its tensor arguments."""


class _Guarded:
    def __init__(self, storage: torch.UntypedStorage, name: str):
        self.storage = storage
        self.names = [name]
        self.nbytes = storage.nbytes()
        self.pad = max(MIN_PAD_BYTES, -(-self.nbytes // 64) * 64)
        self.buf = torch.full((self.nbytes + 2 * self.pad,), PATTERN, dtype=torch.uint8)
        original = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (self.nbytes,), (1,))
        self.buf[self.pad : self.pad + self.nbytes].copy_(original)
        self.original = original

    def view_like(self, t: torch.Tensor) -> torch.Tensor:
        itemsize = t.element_size()
        flat = self.buf[self.pad : self.pad + self.nbytes - self.nbytes % itemsize].view(t.dtype)
        return flat.as_strided(t.shape, t.stride(), self.pad // itemsize + t.storage_offset())

    def restore_and_check(self) -> str | None:
        self.original.copy_(self.buf[self.pad : self.pad + self.nbytes])
        before = (self.buf[: self.pad] != PATTERN).nonzero()
        after = (self.buf[self.pad + self.nbytes :] != PATTERN).nonzero()
        problems = []
        if len(before):
            problems.append(f"up to {self.pad - int(before[0])} bytes before the start")
        if len(after):
            problems.append(f"up to {int(after[-1]) + 1} bytes past the end")
        if problems:
            return f"{' and '.join(problems)} of argument {'/'.join(self.names)}"
        return None


def guarded_launch(launch, kernel_name: str, arg_names: list[str], args: tuple, kwargs: dict):
    """Run ``launch(*args, **kwargs)`` with CPU tensor arguments replaced by guarded copies."""
    guards: dict[int, _Guarded] = {}

    def guard(value, name):
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            return value
        storage = value.untyped_storage()
        key = storage.data_ptr()
        if key not in guards:
            guards[key] = _Guarded(storage, name)
        elif name not in guards[key].names:
            guards[key].names.append(name)
        return guards[key].view_like(value)

    names = list(arg_names) + [f"arg{i}" for i in range(len(arg_names), len(args))]
    new_args = tuple(guard(a, n) for a, n in zip(args, names))
    new_kwargs = {k: guard(v, k) for k, v in kwargs.items()}
    try:
        return launch(*new_args, **new_kwargs)
    finally:
        problems = [p for g in guards.values() if (p := g.restore_and_check())]
        if problems:
            raise OutOfBoundsError(
                f"kernel {kernel_name} stored out of bounds: {'; '.join(problems)} "
                "(a missing or wrong mask on tl.store? with a block pointer, a missing boundary_check?)"
            )
