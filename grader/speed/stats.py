"""The statistics of a timing: quantiles and the median's standard error from a run's samples, and the rule that
says when a measurement has enough rounds (:class:`StopRule`). Pure Python: the tests drive it on a CPU."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Normal-theory constants: IQR = 1.349 σ, and the standard error of a median is √(π/2)·σ/√n.
_IQR_PER_SIGMA = 1.349
_MEDIAN_SE = math.sqrt(math.pi / 2)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, and ``triton.testing``'s)."""
    if not samples:
        raise ValueError("quantile of no samples")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    data = sorted(samples)
    point = q * (len(data) - 1)
    lo, hi = math.floor(point), math.ceil(point)
    return data[lo] + (data[hi] - data[lo]) * (point - lo)


@dataclass(frozen=True)
class Stats:
    """Summary of one candidate's timings, in milliseconds."""

    n: int
    median: float
    mean: float
    stdev: float
    min: float
    max: float
    q1: float
    q3: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def cv(self) -> float:
        """Coefficient of variation (stdev / mean): the spread of single runs."""
        return self.stdev / self.mean if self.mean > 0 else 0.0

    @property
    def robust_cv(self) -> float:
        """The spread of single runs from the IQR (outliers do not move it)."""
        return self.iqr / _IQR_PER_SIGMA / self.median if self.median > 0 else 0.0

    @property
    def rel_se(self) -> float:
        """Relative standard error of the median: how well the median itself is known."""
        if self.n < 2:
            return math.inf
        return _MEDIAN_SE * self.robust_cv / math.sqrt(self.n)

    def to_dict(self) -> dict[str, float]:
        return {
            "n": self.n, "median": self.median, "mean": self.mean, "stdev": self.stdev,
            "min": self.min, "max": self.max, "q1": self.q1, "q3": self.q3,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> Stats:
        return cls(int(data["n"]), *(float(data[k]) for k in ("median", "mean", "stdev", "min", "max", "q1", "q3")))


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        raise ValueError("no samples to summarize")
    data = sorted(float(s) for s in samples)
    return Stats(
        n=len(data),
        median=statistics.median(data),
        mean=statistics.fmean(data),
        stdev=statistics.stdev(data) if len(data) > 1 else 0.0,
        min=data[0],
        max=data[-1],
        q1=quantile(data, 0.25),
        q3=quantile(data, 0.75),
    )


@dataclass(frozen=True)
class RatioInterval:
    """A ratio of two candidates' times from their paired samples (one pair per round: the clock and thermal drift of
    a round move both), its point estimate and an interval of ``Z`` standard errors either side."""

    point: float
    low: float
    high: float
    rounds: int

    def clear_of(self, boundaries: Sequence[float]) -> bool:
        """Whether no boundary lies inside the interval."""
        return all(b < self.low or b > self.high for b in boundaries)

    def between(self, boundaries: Sequence[float]) -> bool:
        """Whether the point lies between the lowest and the highest boundary (where credit is proportional)."""
        return bool(boundaries) and min(boundaries) < self.point < max(boundaries)

    def to_dict(self) -> dict[str, float]:
        return {"point": self.point, "low": self.low, "high": self.high, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> RatioInterval:
        return cls(float(data["point"]), float(data["low"]), float(data["high"]), int(data["rounds"]))


Z = 2.0  # standard errors either side of a ratio's point estimate: about a 95 % interval


def paired_ratio(samples: Mapping[str, Sequence[float]], numerator: str, denominator: str) -> RatioInterval | None:
    """``numerator / denominator`` round by round, summarized: the median of the per-round ratios and ±``Z``
    standard errors of it (None before two rounds)."""
    top, bottom = samples.get(numerator, ()), samples.get(denominator, ())
    ratios = [a / b for a, b in zip(top, bottom) if b > 0]
    if len(ratios) < 2:
        return None
    stats = summarize(ratios)
    half = Z * stats.rel_se * stats.median
    return RatioInterval(stats.median, stats.median - half, stats.median + half, len(ratios))


def drift(samples: Sequence[float]) -> float:
    """How far the median of the second half of ``samples`` (in round order) moved from the first half's, relative
    (0.0 with fewer than 6 samples): a yardstick whose own time moves during the rounds measures a GPU that changed."""
    if len(samples) < 6:
        return 0.0
    half = len(samples) // 2
    first, second = statistics.median(samples[:half]), statistics.median(samples[half:])
    return abs(second / first - 1.0) if first > 0 else 0.0


def cv(values: Sequence[float]) -> float:
    """Coefficient of variation of a few values (e.g. one ratio measured in several runs)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else 0.0


@dataclass(frozen=True)
class StopRule:
    """When to stop adding rounds. ``check`` returns the reason to stop, or None to go on. The defaults are
    calibration's (``grader calibrate``, ``grader bench``, ``pytest -m speed``); grading's are :meth:`grading`."""

    min_rounds: int = 20
    max_rounds: int = 2000
    rel_se: float = 0.003  # every median known to ±0.3 % (one standard error)
    budget_s: float = 2.0  # wall-clock seconds for the rounds (warm-up not counted)
    # Grading beside a yardstick: stop on the interval of ``pair``'s ratio (numerator, denominator) instead of every
    # median, once it is clear of every credit boundary (and, between them, known to ``rel_se``).
    pair: tuple[str, str] | None = None
    boundaries: tuple[float, ...] = ()

    @classmethod
    def grading(cls, budget_s: float) -> StopRule:
        """The trusted timer's rule when grading: every median known to ±1 %, after at least 10 rounds. Its rounds
        hold the GPU alone, and every other process on it waits meanwhile; ±1 % is inside the credit's margins (full
        credit at 0.92 of the reference's calibrated ratio at most, a kernel 15 % slower at 0.87 of it). A benchmark
        whose calls spread by an IQR of 3.5 % of the median (FlashAttention's forward and backward) needs 11 rounds
        for ±1 %, 43 for ±0.5 %. The thresholds themselves come from calibration's finer rule. Measured in
        docs/decisions/0001-grading-timing-rule.md."""
        return cls(min_rounds=10, rel_se=0.01, budget_s=budget_s)

    @classmethod
    def beside(cls, budget_s: float, pair: tuple[str, str], boundaries: Sequence[float]) -> StopRule:
        """Grading against a yardstick timed in the same rounds: stop once the interval of ``pair``'s ratio is clear
        of every credit boundary (a kernel far above full credit or far below none needs few rounds) and, where it
        lies between two of them (proportional credit), known to ±1 %; while it straddles one, go on within the
        budget."""
        return cls(min_rounds=10, rel_se=0.01, budget_s=budget_s, pair=pair, boundaries=tuple(boundaries))

    def __post_init__(self) -> None:
        if self.min_rounds < 1 or self.max_rounds < self.min_rounds:
            raise ValueError(f"need 1 <= min_rounds <= max_rounds, got {self.min_rounds}, {self.max_rounds}")
        if self.rel_se <= 0 or self.budget_s <= 0:
            raise ValueError("rel_se and budget_s must be positive")

    def check(self, samples: Mapping[str, Sequence[float]], elapsed_s: float) -> str | None:
        n = min((len(s) for s in samples.values()), default=0)
        if n == 0:
            return None
        if n >= self.max_rounds:
            return "max_rounds"
        if n >= self.min_rounds and self._converged(samples):
            return "converged"
        # The budget never stops before a few rounds: the timed outputs of both input sets must be
        # re-checked at least once (a result left over from the previous call is caught there).
        if elapsed_s >= self.budget_s and n >= min(self.min_rounds, 3):
            return "budget"
        return None

    def _converged(self, samples: Mapping[str, Sequence[float]]) -> bool:
        if self.pair is not None and all(name in samples for name in self.pair):
            interval = paired_ratio(samples, *self.pair)
            if interval is None:
                return False
            known = (interval.high - interval.low) / 2 / Z <= self.rel_se * interval.point
            if not self.boundaries:
                return known
            return interval.clear_of(self.boundaries) and (known or not interval.between(self.boundaries))
        return all(summarize(s).rel_se <= self.rel_se for s in samples.values())
