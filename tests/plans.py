"""Launch plans for tests that run without a GPU: what the recorder would make of a call of one kernel."""

from __future__ import annotations

import json

from grader.speed.plan import Arg, Buffer, KernelImage, LaunchPlan, Step, View


def toy_plan(n: int = 1024, *, dtype: str = "float32", itemsize: int = 4) -> LaunchPlan:
    """``y = f(x)`` over ``n`` elements: one launch of a kernel ``_toy_kernel(x_ptr, y_ptr, n, BLOCK)``."""
    nbytes = n * itemsize
    kernel = KernelImage("_toy_kernel", json.dumps({"name": "_toy_kernel", "num_warps": 4}), b"\x7fELF-not-a-cubin",
                         {"x_ptr": f"*{'fp32' if dtype == 'float32' else 'bf16'}",
                          "y_ptr": f"*{'fp32' if dtype == 'float32' else 'bf16'}", "n": "i32", "BLOCK": "constexpr"})
    x = View(0, 0, dtype, (n,), (1,))
    y = View(1, 0, dtype, (n,), (1,))
    launch = Step("launch", 0, 0, ((n + 1023) // 1024, 1, 1),
                  (Arg("tensor", x), Arg("tensor", y), Arg("scalar", value=n), Arg("constexpr", value=1024)))
    return LaunchPlan([kernel], [Buffer("input", nbytes, "x"), Buffer("output", nbytes, "y")], [launch], {"y": y})
