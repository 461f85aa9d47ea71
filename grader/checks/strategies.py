"""Hypothesis building blocks shared by the exercise specs: sizes, shapes, dtypes, layouts, seeds.

Sizes favour the places kernels break: 1, primes, powers of two and their neighbours (one past a
block boundary is the classic missing-mask bug).

Hypothesis is imported only when a strategy is built: the grader's workers and trusted timers import the exercises
(their references, inputs and checks) but never draw a case, and importing hypothesis would cost each of them a
fraction of a second of CPU.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from grader.checks.tensors import LAYOUTS

if TYPE_CHECKING:
    from hypothesis import strategies as st

EDGE_SIZES = (1, 2, 3, 5, 7, 13, 16, 17, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025,
              2047, 2049, 4095, 4096, 4097)
DTYPE_NAMES = ("float32", "float16", "bfloat16")


def composite(build: Callable[..., Any]) -> Callable[..., st.SearchStrategy]:
    """``hypothesis.strategies.composite``, applied when the strategy is first built (see the module's note)."""
    @functools.wraps(build)
    def strategy(*args: Any, **kwargs: Any) -> st.SearchStrategy:
        from hypothesis import strategies as st

        return st.composite(build)(*args, **kwargs)

    return strategy


def sizes(max_size: int, min_size: int = 1) -> st.SearchStrategy[int]:
    from hypothesis import strategies as st

    edges = [s for s in EDGE_SIZES if min_size <= s <= max_size]
    return st.one_of(st.sampled_from(edges), st.integers(min_size, max_size))


@composite
def shapes(draw, *, min_dims: int = 1, max_dims: int = 3, max_numel: int, max_last: int | None = None):
    """Shapes whose product stays under ``max_numel`` (the last dim drawn first, up to ``max_last``)."""
    from hypothesis import strategies as st

    ndim = draw(st.integers(min_dims, max_dims))
    if ndim == 0:
        return ()
    last = draw(sizes(min(max_last or max_numel, max_numel)))
    dims = [last]
    budget = max_numel // last
    for _ in range(ndim - 1):
        d = draw(sizes(max(1, min(budget, 64))))
        dims.insert(0, d)
        budget = max(1, budget // d)
    assert math.prod(dims) <= max_numel or ndim == 1
    return tuple(dims)


def dtypes() -> st.SearchStrategy[str]:
    from hypothesis import strategies as st

    return st.sampled_from(DTYPE_NAMES)


def layouts() -> st.SearchStrategy[str]:
    from hypothesis import strategies as st

    return st.sampled_from(LAYOUTS)


def seeds() -> st.SearchStrategy[int]:
    from hypothesis import strategies as st

    return st.integers(0, 2**31 - 1)


def cases(**fields: st.SearchStrategy) -> st.SearchStrategy:
    """Cases whose params are drawn from ``fields`` (in order) plus a seed; hypothesis reports a failing
    one as ``Case(shape=..., dtype=..., seed=...)``."""
    from grader.checks.spec import Case

    @composite
    def build(draw):
        params = {name: draw(strategy) for name, strategy in fields.items()}
        return Case(params, draw(seeds()))

    return build()
