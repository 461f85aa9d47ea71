"""The exercise contract: what one exercise declares so that pytest, the grader and the benchmarks can
run it without knowing anything else about it.

An exercise (``grader/exercises/<name>.py``) is a list of graded :class:`Part` s. A part names the
student functions it calls, builds inputs for a :class:`Case` (a small, JSON-able description plus a
seed), calls the student's API, computes the float64 reference and says how close is close enough.
Every check a part promises is declared here: its examples and random cases, integrity cases, bad
inputs, extra checks (:class:`ExtraCheck`) and benchmarks; :mod:`grader.checks.catalog` lists them for
pytest and for the grader alike. Everything is data or a pure function of its arguments, so the grader
builds the inputs in a process that never imports student code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from grader.checks.verdicts import Verdict

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass(frozen=True)
class Case:
    """One test case: JSON-able parameters (shape, dtype name, layout, value range, ...) and a seed."""

    params: Mapping[str, Any]
    seed: int = 0

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.params["dtype"]]

    @property
    def label(self) -> str:
        return "-".join(f"{k}={_short(v)}" for k, v in self.params.items())

    def with_seed(self, seed: int) -> Case:
        return Case(dict(self.params), seed)

    def to_dict(self) -> dict[str, Any]:
        return {"params": dict(self.params), "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Case:
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in data["params"].items()}
        return cls(params, int(data.get("seed", 0)))

    def __repr__(self) -> str:  # hypothesis prints this for the falsifying example
        inner = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"Case({inner}, seed={self.seed})"


def _short(value: Any) -> str:
    if isinstance(value, tuple | list):
        return "x".join(str(v) for v in value) or "scalar"
    return str(value)


@dataclass(frozen=True)
class Tolerance:
    dtype: torch.dtype
    atol: float
    rtol: float


class Tolerances:
    """``(dtype, atol, rtol)`` entries, optionally overridden on CUDA (e.g. TF32 ``tl.dot``).

    A value passes when ``|got - expected| <= atol + rtol * |expected|`` (``torch.isclose``).
    """

    def __init__(self, *entries: tuple[torch.dtype, float, float], cuda: Sequence[tuple] = ()):
        self._base = {d: Tolerance(d, a, r) for d, a, r in entries}
        self._cuda = {d: Tolerance(d, a, r) for d, a, r in cuda}

    def get(self, dtype: torch.dtype, device: str) -> Tolerance:
        if device == "cuda" and dtype in self._cuda:
            return self._cuda[dtype]
        try:
            return self._base[dtype]
        except KeyError:
            raise KeyError(f"no tolerance declared for {dtype}") from None


@dataclass(frozen=True)
class BadInput:
    """A call that must raise: the API's argument checking, tested like any other behaviour."""

    label: str
    function: str
    make_args: Callable[[str], tuple[tuple, dict]]  # device -> (args, kwargs)
    raises: tuple[type[BaseException], ...] = (ValueError, TypeError)
    match: str = ""  # regex the message must match (case-insensitive)


Inputs = dict[str, Any]
Outputs = dict[str, torch.Tensor]
Observation = Mapping[str, Any]


@dataclass(frozen=True)
class ExtraCheck:
    """A check of a part beyond its cases (e.g. FlashAttention's "never materialize the scores").

    Split like every check: ``execute(module, device)`` runs in the process that imported the student's
    module and returns an observation of plain data whose keys and types ``fields`` declares (the grader
    refuses anything else from its worker); ``judge(observation, device)`` turns it into a verdict where
    student code cannot reach. ``execute`` lets NotImplementedError through (the function is not written).
    pytest runs it as ``test_<part>_<name>``; the grader plans it as check ``<part>.<name>``.
    """

    name: str
    description: str
    execute: Callable[[ModuleType, str], Observation]
    judge: Callable[[Observation, str], Verdict]
    fields: Mapping[str, type | tuple[type, ...]]
    points: float = 0.0


@dataclass(frozen=True)
class Part:
    """One graded part of an exercise (e.g. the forward pass)."""

    name: str
    functions: tuple[str, ...]  # names the student's module must define for this part
    make_inputs: Callable[[Case], Inputs]  # deterministic from case.seed, on the CPU
    call: Callable[[ModuleType, Inputs], Outputs]  # runs the student's API on device inputs
    reference: Callable[[Inputs], Outputs]  # float64, CPU
    # device -> hypothesis strategy of Case (import hypothesis inside: workers and timers never draw). Parts
    # given the same function share the random draw's shapes, each with values of its own.
    cases: Callable[[str], Any]
    examples: tuple[Case, ...]  # fixed edge cases, always run, in this order
    tolerances: Tolerances | Mapping[str, Tolerances]
    points: float = 10.0  # correctness: shared among the examples, random cases and bad inputs
    skip: Callable[[Case, str], str | None] = lambda case, device: None
    bad_inputs: tuple[BadInput, ...] = ()
    allowed_ops: frozenset[str] = frozenset()  # extra aten ops this part may dispatch
    report_as: str | None = None  # parts sharing this key report "not implemented" once
    integrity_cases: tuple[Case, ...] = ()  # default: the first example (see integrity_examples)
    extra_checks: tuple[ExtraCheck, ...] = ()
    # Speed (GPU only): benchmark sizes, baselines (name -> callable on device inputs) and the
    # baseline that speed thresholds are expressed relative to.
    benchmarks: tuple[Benchmark, ...] = ()
    baselines: Mapping[str, Callable[[Inputs], Any]] = field(default_factory=dict)
    speed_baseline: str | None = None
    speed_points: float = 0.0
    # The computation as plain PyTorch ops, one kernel each (what torch.compile fuses), where no baseline already
    # is: ``grader profile`` shows it beside the student's call, to count the round trips to memory fusion saves.
    unfused: Callable[[Inputs], Any] | None = None
    # Triton kernels one call of the reference solution launches (tests/speed/test_profile.py records it): a report of a
    # part below full speed puts the student's launches beside it.
    reference_launches: int | None = None
    exercise: Exercise | None = field(default=None, compare=False, repr=False)  # set by the Exercise

    @property
    def integrity_examples(self) -> tuple[Case, ...]:
        """The cases the integrity rules are checked on: the declared ones, else the first example."""
        return self.integrity_cases or self.examples[:1]

    @property
    def speed_graded(self) -> bool:
        return self.speed_points > 0 and bool(self.benchmarks) and self.speed_baseline is not None

    @property
    def max_points(self) -> float:
        """Points this part can earn, before the course's weights: correctness, extra checks and speed."""
        return self.points + sum(x.points for x in self.extra_checks) + (self.speed_points if self.speed_graded else 0)

    def tolerance(self, output: str, dtype: torch.dtype, device: str) -> Tolerance:
        tols = self.tolerances
        if not isinstance(tols, Tolerances):
            tols = tols[output]
        return tols.get(dtype, device)

    @property
    def missing_key(self) -> str:
        return self.report_as or ",".join(self.functions)


@dataclass(frozen=True)
class Benchmark:
    """A benchmark size for a part: inputs come from ``part.make_inputs(case)`` moved to the GPU.
    Sized to fill an H100/H200 but fit in 40 GB."""

    label: str
    case: Case
    bytes_moved: Callable[[Inputs], float] | None = None  # fewest bytes a fused kernel must move
    flops: Callable[[Inputs], float] | None = None  # useful floating-point operations


@dataclass(frozen=True)
class Exercise:
    name: str  # folder under assignments/ and solutions/
    module: str  # file stem of the student module inside that folder
    title: str
    parts: tuple[Part, ...]
    order: int = 100  # position in the course

    def __post_init__(self) -> None:
        for part in self.parts:  # a part knows its exercise (frozen: set once, here)
            object.__setattr__(part, "exercise", self)

    @property
    def max_points(self) -> float:
        return sum(p.max_points for p in self.parts)

    @property
    def handout(self) -> str:
        return f"assignments/{self.name}/README.md"

    def part(self, name: str) -> Part:
        for part in self.parts:
            if part.name == name:
                return part
        raise KeyError(f"exercise {self.name!r} has no part {name!r}")
