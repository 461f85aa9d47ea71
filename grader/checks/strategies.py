"""Hypothesis building blocks shared by the exercise specs: sizes, shapes, dtypes, layouts, seeds.

Sizes favour the places kernels break: 1, primes, powers of two and their neighbours (one past a
block boundary is the classic missing-mask bug).
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from grader.checks.tensors import LAYOUTS

EDGE_SIZES = (1, 2, 3, 5, 7, 13, 16, 17, 31, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1023, 1024, 1025,
              2047, 2049, 4095, 4096, 4097)
DTYPE_NAMES = ("float32", "float16", "bfloat16")


def sizes(max_size: int, min_size: int = 1) -> st.SearchStrategy[int]:
    edges = [s for s in EDGE_SIZES if min_size <= s <= max_size]
    return st.one_of(st.sampled_from(edges), st.integers(min_size, max_size))


@st.composite
def shapes(draw, *, min_dims: int = 1, max_dims: int = 3, max_numel: int, max_last: int | None = None):
    """Shapes whose product stays under ``max_numel`` (the last dim drawn first, up to ``max_last``)."""
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
    return st.sampled_from(DTYPE_NAMES)


def layouts() -> st.SearchStrategy[str]:
    return st.sampled_from(LAYOUTS)


def seeds() -> st.SearchStrategy[int]:
    return st.integers(0, 2**31 - 1)


def cases(**fields: st.SearchStrategy) -> st.SearchStrategy:
    """Cases whose params are drawn from ``fields`` (in order) plus a seed; hypothesis reports a failing
    one as ``Case(shape=..., dtype=..., seed=...)``."""
    from grader.checks.spec import Case

    @st.composite
    def build(draw):
        params = {name: draw(strategy) for name, strategy in fields.items()}
        return Case(params, draw(seeds()))

    return build()
