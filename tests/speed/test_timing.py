"""The timing engine on a CPU with a fake clock: statistics, the stopping rule, interleaving, fresh
inputs, re-checked outputs, graph mode and the pytest-benchmark timer."""

from __future__ import annotations

import math

import pytest
import torch

from grader.checks import tensors
from grader.grading.commands import calibrate
from grader.speed import stats, timing
from grader.speed.timing import Candidate, StopRule
from tests.fake_clock import FakeClock


def test_summarize_known_samples():
    s = stats.summarize([4.0, 1.0, 100.0, 3.0, 2.0])
    assert (s.n, s.median, s.min, s.max, s.q1, s.q3) == (5, 3.0, 1.0, 100.0, 2.0, 4.0)
    assert s.mean == pytest.approx(22.0)
    assert s.robust_cv == pytest.approx(2.0 / 1.349 / 3.0)  # the outlier does not move it
    assert s.cv > 1.0  # ... but it moves the plain coefficient of variation
    assert s.rel_se == pytest.approx(math.sqrt(math.pi / 2) * s.robust_cv / math.sqrt(5))
    assert stats.Stats.from_dict(s.to_dict()) == s


def test_quantile_interpolates_and_rejects_bad_input():
    assert stats.quantile([0.0, 10.0], 0.25) == 2.5
    with pytest.raises(ValueError, match="no samples"):
        stats.quantile([], 0.5)
    with pytest.raises(ValueError, match="outside"):
        stats.quantile([1.0], 1.5)
    with pytest.raises(ValueError, match="no samples"):
        stats.summarize([])


def test_single_sample_has_unknown_precision():
    assert stats.summarize([2.0]).rel_se == math.inf
    assert stats.cv([5.0]) == 0.0
    assert stats.cv([1.0, 3.0]) == pytest.approx(math.sqrt(2) / 2)


def test_rel_se_shrinks_with_more_samples():
    few = stats.summarize([1.0, 1.1, 0.9, 1.05, 0.95] * 2)
    many = stats.summarize([1.0, 1.1, 0.9, 1.05, 0.95] * 20)
    assert many.rel_se < few.rel_se / 3


def test_stop_rule_converges_only_after_min_rounds():
    rule = StopRule(min_rounds=5, rel_se=0.01, budget_s=10)
    assert rule.check({"a": [1.0] * 4, "b": [2.0] * 4}, 0.0) is None
    assert rule.check({"a": [1.0] * 5, "b": [2.0] * 5}, 0.0) == "converged"
    assert rule.check({"a": [], "b": []}, 100.0) is None  # nothing measured yet: never stop


def test_stop_rule_waits_for_every_candidate():
    rule = StopRule(min_rounds=5, rel_se=0.01, budget_s=10)
    noisy = [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    assert rule.check({"a": [1.0] * 6, "b": noisy}, 0.0) is None
    assert rule.check({"a": [1.0] * 6, "b": noisy}, 10.0) == "budget"


def test_budget_allows_a_few_rounds_first():
    rule = StopRule(min_rounds=20, budget_s=1.0)
    assert rule.check({"a": [1.0, 3.0]}, 5.0) is None
    assert rule.check({"a": [1.0, 3.0, 1.0]}, 5.0) == "budget"


def test_stop_rule_max_rounds_and_validation():
    assert StopRule(min_rounds=2, max_rounds=3).check({"a": [1.0, 9.0, 1.0]}, 0.0) == "max_rounds"
    with pytest.raises(ValueError):
        StopRule(min_rounds=0)
    with pytest.raises(ValueError):
        StopRule(min_rounds=10, max_rounds=5)
    with pytest.raises(ValueError):
        StopRule(budget_s=0)


def test_grading_stops_where_a_median_is_known_to_one_percent_calibration_goes_on():
    """The trusted timer's rule when grading: ±1 % after 10 rounds, where calibration's rule (±0.3 % after 20)
    still adds rounds; a noisier benchmark goes on under both; the budget is each rule's own."""
    samples = [1.0 + 0.014 * k for k in (-2, -1, 1, 2, 0, -2, -1, 1, 2, 0)]  # ten rounds, a spread of ~2 %
    known = stats.summarize(samples).rel_se
    assert 0.003 < known < 0.01, known  # the premise: between the two rules' precisions
    grading = StopRule.grading(budget_s=10.0)
    assert grading.check({"student": samples[:9], "torch": [1.0] * 9}, 0.0) is None  # fewer than 10 rounds
    assert grading.check({"student": samples, "torch": [1.0] * 10}, 0.0) == "converged"
    assert StopRule(budget_s=10.0).check({"student": samples, "torch": [1.0] * 10}, 0.0) is None
    noisy = [1.0 + 0.03 * k for k in (-2, -1, 1, 2, 0, -2, -1, 1, 2, 0)]  # a spread of ~4 %: not known to ±1 %
    assert stats.summarize(noisy).rel_se > 0.01
    assert grading.check({"student": noisy, "torch": [1.0] * 10}, 0.0) is None
    assert grading.budget_s == 10.0 and grading.check({"student": [1.0, 2.0, 1.5]}, 10.0) == "budget"


def test_the_trusted_timer_times_under_gradings_rule(tmp_path, monkeypatch):
    """Every benchmark of a part timed in its turn alone gets :meth:`StopRule.grading` with its share of the part's
    budget (calibration's rule would hold the GPU alone about twice as long)."""
    from types import SimpleNamespace

    from grader.speed import timer, trusted

    rules = []
    monkeypatch.setattr(trusted, "measure_prepared", lambda entry, **kw: rules.append((entry.bench.label, kw["rule"])))
    monkeypatch.setattr(trusted, "finish", lambda entry: SimpleNamespace(
        row=SimpleNamespace(to_dict=lambda: {"label": entry.bench.label}, error=None), mismatch=None))
    entries = [SimpleNamespace(replay=object(), bench=SimpleNamespace(label=label), row=SimpleNamespace(error=None),
                               yardstick=yardstick) for label, yardstick in (("small", None), ("large", object()))]
    job = timer.TimerJob("gelu", "forward", 6.0, {}, boundaries=[0.5, 0.92])
    result = timer.time_prepared(timer.PreparedJob(job, timer.TimerResult("fake GPU"), entries, 3.0), tmp_path)
    # beside the reference (the yardstick), the rounds stop on the interval of its ratio to the student's
    assert rules == [("small", StopRule.grading(3.0)),
                     ("large", StopRule.beside(3.0, ("reference", "student"), (0.5, 0.92)))]
    assert StopRule.grading(3.0) != StopRule(budget_s=3.0)
    assert [row["label"] for row in result.benchmarks] == ["small", "large"]
    assert len(result.gpu_state) == 2  # sampled before and after the rounds (empty where NVML is missing)


def test_beside_a_yardstick_the_rounds_stop_once_the_ratio_is_clear_of_every_credit_boundary():
    """Grading beside the reference: a kernel far from every boundary stops at the minimum rounds even where its
    own median is noisy; one straddling a boundary goes on to the budget; between the boundaries (proportional
    credit) the ratio must be known to ±1 %."""
    rule = StopRule.beside(10.0, ("reference", "student"), (0.5, 0.92))
    reference = [1.0 + 0.03 * k for k in (-2, -1, 1, 2, 0, -2, -1, 1, 2, 0)]  # noisy: a spread of ~4 %
    far_faster = {"reference": reference, "student": [r / 1.3 for r in reference]}  # 1.3x the reference, paired
    assert rule.check(far_faster, 0.0) == "converged"
    assert StopRule.grading(10.0).check(far_faster, 0.0) is None  # its medians are not known to ±1 %
    jitter = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 1.1, 0.9, 1.05, 0.95]  # ratio ~0.92 ± 10 %: the boundary inside
    at_boundary = {"reference": [0.92] * 10, "student": jitter}
    interval = stats.paired_ratio(at_boundary, "reference", "student")
    assert interval is not None and interval.low < 0.92 < interval.high
    assert rule.check(at_boundary, 0.0) is None
    assert rule.check(at_boundary, 10.0) == "budget"
    between = {"reference": [0.7] * 10, "student": jitter}  # 0.7 ± 10 %: clear of 0.5 and 0.92, not known to ±1 %
    assert rule.check(between, 0.0) is None
    steady = {"reference": [0.7] * 10, "student": [1.0] * 10}
    assert rule.check(steady, 0.0) == "converged"
    assert rule.check({"reference": reference[:9], "student": reference[:9]}, 0.0) is None  # under 10 rounds


def _timed(clock: FakeClock, ms: float, log: list | None = None, name: str = ""):
    def fn(inputs):
        clock.advance(ms)
        if log is not None:
            log.append(name)
        return inputs["x"] * 2

    return fn


def _sources():
    return [{"x": torch.arange(4.0)}, {"x": torch.arange(4.0) + 10}]


def test_measure_interleaves_and_reports_exact_fake_times():
    clock = FakeClock(flush_ms=5.0)  # flush time must not be counted
    log: list[str] = []
    result = timing.measure(
        [Candidate("fast", _timed(clock, 1.0, log, "fast")), Candidate("slow", _timed(clock, 2.0, log, "slow"))],
        _sources(), clock=clock, rule=StopRule(min_rounds=6), warmup_ms=0, graph_below_ms=None,
    )
    assert result.stop == "converged" and result.rounds == 6 and result.mode == "events"
    assert result.samples == {"fast": [1.0] * 6, "slow": [2.0] * 6}
    assert result.ratio("slow", "fast") == 2.0
    rounds = log[-12:]  # the timed rounds come last; the order rotates every round
    assert [rounds[i] for i in range(0, 12, 2)] == ["fast", "slow"] * 3
    assert clock.flushes >= 12
    data = result.to_dict()
    assert data["times"]["slow"]["median"] == 2.0 and data["rounds"] == 6 and data["stop"] == "converged"


def test_measure_gives_fresh_inputs_and_alternates_input_sets():
    clock = FakeClock()
    sources = _sources()
    seen = []

    def destructive(inputs):  # modifies its input: must not leak into the next call or the sources
        clock.advance(1.0)
        total = inputs["x"].sum().item()
        inputs["x"].zero_()
        return total

    def check(output, index):
        seen.append(index)
        expected = sources[index]["x"].sum().item()
        return None if output == expected else f"got {output}, expected {expected}"

    result = timing.measure([Candidate("d", destructive, check)], sources, clock=clock,
                            rule=StopRule(min_rounds=4), warmup_ms=0, graph_below_ms=None)
    assert result.problems == [] and result.stop == "converged"
    assert seen[:2] == [0, 1]  # warm-up: every input set once
    assert seen[2:] == [0, 1, 0, 1]  # timed rounds alternate the sets
    assert torch.equal(sources[0]["x"], torch.arange(4.0))  # the sources are never handed out


def test_a_failed_check_stops_the_measurement():
    clock = FakeClock()
    calls = {"n": 0}

    def stale(inputs):  # right for the first two calls, then returns a stale result
        clock.advance(1.0)
        calls["n"] += 1
        return "ok" if calls["n"] <= 2 else "stale"

    result = timing.measure(
        [Candidate("s", stale, lambda out, i: None if out == "ok" else "cached result")],
        _sources(), clock=clock, rule=StopRule(min_rounds=10), warmup_ms=0, graph_below_ms=None,
    )
    assert result.stop == "problem" and result.problems == ["cached result"]


def test_a_raising_candidate_is_named():
    clock = FakeClock()

    def boom(inputs):
        raise RuntimeError("bad launch")

    with pytest.raises(timing.CandidateError, match="student raised RuntimeError: bad launch") as info:
        timing.measure([Candidate("base", _timed(clock, 1.0)), Candidate("student", boom)], _sources(), clock=clock)
    assert info.value.name == "student" and isinstance(info.value.error, RuntimeError)


def test_measure_rejects_bad_arguments():
    clock = FakeClock()
    with pytest.raises(ValueError, match="nothing"):
        timing.measure([], _sources(), clock=clock)
    with pytest.raises(ValueError, match="input sets"):
        timing.measure([Candidate("a", _timed(clock, 1))], [], clock=clock)
    with pytest.raises(ValueError, match="unique"):
        timing.measure([Candidate("a", _timed(clock, 1)), Candidate("a", _timed(clock, 1))], _sources(), clock=clock)


def test_short_kernels_are_replayed_from_graphs():
    clock = FakeClock(graph_speedup_ms=0.004)  # the replay saves the launch overhead
    result = timing.measure(
        [Candidate("a", _timed(clock, 0.005)), Candidate("b", _timed(clock, 0.010))],
        _sources(), clock=clock, rule=StopRule(min_rounds=5), warmup_ms=0, graph_below_ms=0.02,
    )
    assert result.mode == "graph" and clock.captures == 2
    assert result.stats("a").median == pytest.approx(0.001)
    assert result.stats("b").median == pytest.approx(0.006)


def test_graph_mode_refills_inputs_and_rechecks_the_static_output():
    clock = FakeClock()
    sources = _sources()
    seen = []

    def check(output, index):
        seen.append(index)
        return None if torch.equal(output, sources[index]["x"] * 2) else "stale graph output"

    result = timing.measure([Candidate("a", _timed(clock, 0.001), check)], sources, clock=clock,
                            rule=StopRule(min_rounds=4), warmup_ms=0, graph_below_ms=0.02)
    assert result.mode == "graph" and result.problems == [] and seen[2:] == [0, 1, 0, 1]


def test_failed_capture_falls_back_to_events_for_everyone():
    clock = FakeClock(capture_fails=True)
    result = timing.measure([Candidate("a", _timed(clock, 0.005))], _sources(), clock=clock,
                            rule=StopRule(min_rounds=3), warmup_ms=0, graph_below_ms=0.02)
    assert result.mode == "events" and "capture failed" in result.notes[0]
    assert result.stats("a").median == pytest.approx(0.005)


def test_budget_stops_a_noisy_measurement():
    clock = FakeClock()
    durations = iter([1.0, 3.0] * 10_000)

    def noisy(inputs):
        clock.advance(next(durations))

    result = timing.measure([Candidate("n", noisy)], _sources(), clock=clock,
                            rule=StopRule(min_rounds=5, rel_se=1e-4, budget_s=0.1), warmup_ms=0, graph_below_ms=None)
    assert result.stop == "budget"
    assert 5 <= result.rounds <= 60  # ~2 ms per round of simulated time, 100 ms of budget


def test_warmup_runs_until_warmup_ms():
    clock = FakeClock()
    log: list[str] = []
    timing.measure([Candidate("a", _timed(clock, 1.0, log, "a"))], _sources(), clock=clock,
                   rule=StopRule(min_rounds=1), warmup_ms=10, graph_below_ms=None)
    # 2 input sets + 3 estimate calls + 10 warm-up calls, then 2 timed rounds (a median from one
    # sample has unknown precision; two equal samples converge)
    assert len(log) == 2 + 3 + 10 + 2


def test_clone_exact_keeps_strides_and_copies():
    base = torch.arange(12.0).view(3, 4).t()[1:]
    copy = timing.clone_exact(base)
    assert copy.stride() == base.stride() and copy.storage_offset() == base.storage_offset()
    assert torch.equal(copy, base) and copy.data_ptr() != base.data_ptr()
    assert timing.clone_exact(3) == 3


def _benchmark_inputs(device: str) -> list[tuple[str, dict, dict]]:
    """Every speed-graded part's inputs for a small case, built on the CPU and drawn on ``device``."""
    found = []
    for exercise, part in calibrate.speed_parts():
        case = part.examples[0].with_seed(11)
        with tensors.generated_on(device):
            drawn = part.make_inputs(case)
        found.append((f"{exercise.name}.{part.name}", part.make_inputs(case), drawn))
    return found


def _layout(value):
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.storage_offset(), value.dtype)
    return value


def test_benchmark_inputs_drawn_on_the_cpu_are_the_usual_ones():
    for name, usual, drawn in _benchmark_inputs("cpu"):
        assert usual.keys() == drawn.keys(), name
        for key, value in usual.items():
            assert _layout(drawn[key]) == _layout(value), (name, key)
            if isinstance(value, torch.Tensor):
                assert tensors.same_bits(drawn[key], value), (name, key)


@pytest.mark.gpu
def test_benchmark_inputs_drawn_on_the_gpu_keep_shapes_layouts_and_dtypes():
    for name, usual, drawn in _benchmark_inputs("cuda"):
        assert usual.keys() == drawn.keys(), name
        for key, value in usual.items():
            assert _layout(drawn[key]) == _layout(value), (name, key)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert drawn[key].device.type == "cuda", (name, key)
                assert torch.isfinite(drawn[key]).any(), (name, key)

