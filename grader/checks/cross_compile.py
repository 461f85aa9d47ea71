"""Compile every reference solution's kernels for the GPUs a course may have (:data:`TARGETS`), without a GPU.

:func:`capture` learns what the references launch: it runs each exercise's reference (``solutions/``) under the
Triton interpreter, as the CPU test suite does, on every part's examples, integrity cases and benchmark cases, and
records each ``kernel[grid](...)`` (:func:`grader.checks.integrity.launches_through`) instead of running it: the
arguments' dtypes, alignments and values, the constexprs and the options (num_warps, num_stages; an autotuned
kernel's first config). Inputs are made on PyTorch's meta device (shapes, dtypes, strides, no values): no kernel
runs, so the GPU-sized benchmarks and the GPU-only examples (bf16, long sequences) cost nothing, and every dtype the
exercises use (fp32, fp16, bf16) is met. The caller hands in the exercises (``grader.exercises.all_exercises()``)
and sets up the interpreter (the pytest plugin does: autotuned kernels there run their first config, untimed).

For Triton, launches differ by kernel, argument types (i32/i64 or the constant 1; dtypes; descriptors' block
shapes), constexprs and options: ~110 variants, ~6 CPU-minutes for six targets, too long for CI. By default
:func:`capture` keeps ~35 of them (:func:`_covering`): each kernel in every dtype, flag and option value, and at the
smallest and the largest of each block size and head dim. :func:`cross_compile` builds each for a target as
``JITFunction.run`` would on that GPU (the target's backend specializes the arguments: divisibility, and buffer-op
ranges on AMD), in a child process with a Triton cache of its own.

Not covered: launches made on a GPU only. Host code that branches on the device takes its CPU branch (RMSNorm's
dweight block; FlashAttention's tile tables and autotuning, which the interpreter replaces by small fixed tiles;
matmul's autotuning from 1024³): the same kernel code with other tiles, warps and stages. Compiling is not
running; :attr:`Result.shared` can be held against the target's limit.
"""

from __future__ import annotations

import argparse
import inspect
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

from grader.checks.spec import Exercise

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"


class Target(NamedTuple):
    backend: str  # GPUTarget's three fields
    arch: int | str
    warp_size: int
    shared: int  # bytes of shared memory (LDS) one program may use, at most


TARGETS: dict[str, Target] = {
    "sm_75": Target("cuda", 75, 32, 64 << 10),  # Turing (T4)
    "sm_80": Target("cuda", 80, 32, 163 << 10),  # Ampere (A100)
    "sm_86": Target("cuda", 86, 32, 99 << 10),  # Ampere (A10, RTX 30xx)
    "sm_89": Target("cuda", 89, 32, 99 << 10),  # Ada (L4, L40S, RTX 40xx)
    "sm_90": Target("cuda", 90, 32, 227 << 10),  # Hopper (H100, H200)
    "gfx942": Target("hip", "gfx942", 64, 64 << 10),  # CDNA3 (MI300X)
}


@dataclass(frozen=True)
class Pointer:
    """A tensor argument as far as Triton's specialization looks (address % 16; bytes: AMD's buffer ops need < 2 GiB),
    or with a ``block_shape``, a host-side ``TensorDescriptor`` over such a tensor."""

    dtype: str
    offset: int
    nbytes: int
    block_shape: tuple[int, ...] | None = None
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    padding: str = "zero"


@dataclass(frozen=True)
class Variant:
    """A kernel, its arguments (a :class:`Pointer` or the value) and launch options, as first launched at ``source``
    (exercise, part, case)."""

    exercise: str
    module: str  # the file stem of the exercise's module
    kernel: str
    args: tuple[tuple[str, Any], ...]
    constexprs: frozenset[str]  # the names of the arguments declared tl.constexpr
    options: tuple[tuple[str, Any], ...]  # num_warps, num_stages, ...
    source: str

    @property
    def dtypes(self) -> str:
        return "/".join(sorted({a.dtype for _, a in self.args if isinstance(a, Pointer)}))

    @property
    def settings(self) -> list[tuple[str, Any]]:
        return [(n, a) for n, a in self.args if n in self.constexprs] + list(self.options)

    @property
    def label(self) -> str:
        return f"{self.exercise}.{self.kernel}[{self.dtypes}]({', '.join(f'{n}={a!r}' for n, a in self.settings)})"

    def key(self) -> tuple:
        """What tells compilations apart (hints aside, alignment and range: the first launch's are compiled)."""
        def kind(name: str, a: Any) -> Any:
            if name in self.constexprs or a is None or isinstance(a, bool):
                return repr(a)
            if isinstance(a, Pointer):
                return a.dtype, a.block_shape
            return (a == 1, -(2**31) <= a < 2**31) if isinstance(a, int) else type(a).__name__

        return self.exercise, self.kernel, tuple(kind(n, a) for n, a in self.args), self.options


@dataclass(frozen=True)
class Result:
    target: str
    variant: Variant
    ok: bool
    error: str | None = None  # the compiler's message
    signature: str = ""  # the argument types it was compiled with
    shared: int = 0  # bytes of shared memory one program needs
    seconds: float = 0.0


def _child(work: list[tuple[str, Variant]]) -> list[Result]:
    """:func:`_compile_here` in a fresh Python, out of the interpreter (kernels are its wrappers or not from Triton's
    import on) and with a Triton cache of its own (compiled, not found from an earlier run); a crash stays there."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO), env.get("PYTHONPATH"))))
    with tempfile.TemporaryDirectory(prefix="cross-compile-") as tmp:
        env["TRITON_CACHE_DIR"] = tmp
        out = Path(tmp) / "out.pickle"
        done = subprocess.run([sys.executable, "-m", "grader.checks.cross_compile", "--out", str(out)],
                              input=pickle.dumps(work), capture_output=True, cwd=REPO, env=env)
        if done.returncode != 0 or not out.exists():
            tail = done.stderr.decode(errors="replace")[-4000:]
            raise RuntimeError(f"the compiling process exited with {done.returncode}:\n{tail}")
        return pickle.loads(out.read_bytes())


def capture(exercises: Iterable[Exercise], *, every: bool = False) -> list[Variant]:
    """The compilations the references of ``exercises`` launch on their cases: every distinct one if ``every``, else
    those :func:`_covering` keeps. In the Triton interpreter only, where the launches reach its wrappers."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("capture() runs in the Triton interpreter (TRITON_INTERPRET=1, as the CPU test suite)")
    import torch

    from grader.checks import integrity, loader, tensors

    found: dict[tuple, Variant] = {}
    where: list[Any] = [None, ""]  # exercise, source

    def spec(a: Any) -> Any:
        if type(a).__name__ == "TensorDescriptor":
            return Pointer(**{**vars(spec(a.base)), "block_shape": tuple(a.block_shape), "shape": tuple(a.shape),
                              "strides": tuple(a.strides), "padding": a.padding})
        if isinstance(a, torch.Tensor):
            return Pointer(str(a.dtype).removeprefix("torch."), a.data_ptr() % 16, a.untyped_storage().nbytes())
        return a

    def record(kernel, _interpreted, _launch, args, kwargs, _grid, warmup):  # instead of the launch
        if warmup:
            return
        params = inspect.signature(kernel.fn).parameters
        named = {**dict(zip(params, args)), **{k: v for k, v in kwargs.items() if k in params}}
        constexprs = frozenset(n for n in named if "constexpr" in str(params[n].annotation))  # maybe a string
        options = tuple(sorted((k, v) for k, v in kwargs.items() if k not in params))
        variant = Variant(where[0].name, where[0].module, kernel.fn.__name__,
                          tuple((n, spec(v)) for n, v in named.items()), constexprs, options, where[1])
        found.setdefault(variant.key(), variant)

    for exercise in exercises:
        module = loader.load(SOLUTIONS, exercise, tuple(f for p in exercise.parts for f in p.functions))
        for part in exercise.parts:
            for what, case in [*(("example", c) for c in part.examples),
                               *(("integrity", c) for c in part.integrity_cases),
                               *((f"benchmark {b.label}", b.case) for b in part.benchmarks)]:
                where[:] = exercise, f"{exercise.name}/{part.name} {what} {case.label}"
                with tensors.generated_on("meta"):
                    inputs = part.make_inputs(case)
                try:
                    with integrity.launches_through(record):
                        part.call(module, inputs)
                except Exception as exc:
                    raise RuntimeError(f"{where[1]}: the reference raised {type(exc).__name__}: {exc}") from exc
    return list(found.values()) if every else _covering(list(found.values()))


def _covering(variants: list[Variant]) -> list[Variant]:
    """Per kernel, greedily, the variant bringing the most of what is not covered yet (of equals, the one of smallest
    tiles, fastest to compile; then the first met) until all is: every dtype, every value of a flag or an option,
    and the smallest and the largest value of each integer constexpr (block sizes, head dims)."""
    chosen = []
    for kernel in dict.fromkeys((v.exercise, v.kernel) for v in variants):
        pool = [v for v in variants if (v.exercise, v.kernel) == kernel]
        ints: dict[str, set[int]] = {}
        for n, a in (x for v in pool for x in v.settings):
            if type(a) is int and not n.startswith("num_"):
                ints.setdefault(n, set()).add(a)
        ends = {(n, end(s)) for n, s in ints.items() for end in (min, max)}
        units = {v: {("dtypes", v.dtypes)} | {(n, repr(a)) for n, a in v.settings if n not in ints or (n, a) in ends}
                 for v in pool}
        wanted = set().union(*units.values())
        while wanted:
            best = max(pool, key=lambda v: (len(wanted & units[v]), -sum(a for n, a in v.settings
                                                                       if n in ints and type(a) is int)))
            wanted -= units[best]
            chosen.append(best)
    return chosen


def _value(spec: Any) -> Any:
    """An argument for Triton's binder: a stand-in for a tensor where its specialization looks."""
    import torch
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not isinstance(spec, Pointer):
        return spec
    tensor = SimpleNamespace(dtype=getattr(torch, spec.dtype), data_ptr=lambda: spec.offset,
                             ptr_range=lambda: spec.nbytes)
    if spec.block_shape is None:
        return tensor
    return TensorDescriptor(tensor, list(spec.shape), list(spec.strides), list(spec.block_shape), spec.padding)


def _compile_here(work: list[tuple[str, Variant]]) -> list[Result]:
    """Compile each (target, variant) of ``work`` in this process, whose kernels must be ``JITFunction`` s."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    from grader.checks import loader

    results = []
    for target, variant in work:
        print(f"compiling {variant.label} for {target}", file=sys.stderr, flush=True)  # the last line, if it dies
        start = time.perf_counter()
        try:
            gpu = GPUTarget(*TARGETS[target][:3])
            backend = make_backend(gpu)
            exercise = Exercise(variant.exercise, variant.module, variant.exercise, ())
            kernel = getattr(loader.load(SOLUTIONS, exercise), variant.kernel)
            # as JITFunction.run (triton 3.6-3.9) prepares a launch, with the target's backend
            kwargs = {**{n: _value(a) for n, a in variant.args}, **dict(variant.options),
                      "debug": kernel.debug or knobs.runtime.debug,
                      "instrumentation_mode": knobs.compilation.instrumentation_mode}
            binder = create_function_from_signature(kernel.signature, kernel.params, backend)
            options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, *binder(**kwargs))
            compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=gpu,
                                      options=options.__dict__)
            types = ", ".join(str(t) for t in signature.values() if t != "constexpr")
            results.append(Result(target, variant, True, None, types, compiled.metadata.shared,
                                  time.perf_counter() - start))
        except Exception as exc:
            results.append(Result(target, variant, False, f"{type(exc).__name__}: {exc}".strip(),
                                  seconds=time.perf_counter() - start))
    return results


def cross_compile_all(targets: Iterable[str], variants: list[Variant], workers: int | None = None
                      ) -> dict[str, list[Result]]:
    """Compile ``variants`` (:func:`capture` 's) for each of ``targets`` (keys of :data:`TARGETS`), dealt out to
    ``workers`` (default: one per core) child processes; per target, a :class:`Result` per variant, in order."""
    targets = list(targets)
    if set(targets) - set(TARGETS):
        raise ValueError(f"unknown targets {sorted(set(targets) - set(TARGETS))} (known: {', '.join(TARGETS)})")
    work = [(t, v) for t in targets for v in variants]
    n = max(1, min(len(work), workers or os.cpu_count() or 1))
    with ThreadPoolExecutor(n) as pool:
        results: list[Any] = [None] * len(work)
        for i, part in enumerate(pool.map(lambda i: _child(work[i::n]), range(n))):
            results[i::n] = part  # a child's results come in the order of its work
    return {t: results[k * len(variants):(k + 1) * len(variants)] for k, t in enumerate(targets)}


def cross_compile(target: str, variants: list[Variant]) -> list[Result]:
    """:func:`cross_compile_all` for one target."""
    return cross_compile_all([target], variants)[target]


def main() -> int:
    """A child of :func:`cross_compile_all`: compiles the (target, variant) pairs pickled on stdin."""
    parser = argparse.ArgumentParser(prog="python -m grader.checks.cross_compile")
    parser.add_argument("--out", type=Path, required=True)
    parser.parse_args().out.write_bytes(pickle.dumps(_compile_here(pickle.load(sys.stdin.buffer))))
    return 0


if __name__ == "__main__":  # through the package, so that the pickles name grader.checks.cross_compile's classes
    from grader.checks import cross_compile as _module

    sys.exit(_module.main())
