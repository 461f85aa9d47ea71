"""A FlashAttention whose public forward breaks the process it runs in, while its backward and autograd (which
do not go through that function) are the reference's: the crash must cost the forward part only.

On a CPU every call of ``flash_attention_forward`` segfaults. On a GPU its calls at benchmark size launch a
kernel that stores far out of bounds: an illegal memory access, which leaves the CUDA context broken for every
later call of the process (the speed warm-up of the forward part meets it; the correctness cases are smaller).
"""

from __future__ import annotations

from pathlib import Path

SOLUTION = Path(__file__).parent.parent.parent / "solutions" / "flash_attention" / "flash_attention.py"

_BREAKER = '''

@triton.jit
def _store_out_of_bounds(x_ptr):
    tl.store(x_ptr + (1 << 40), 1.0)  # a terabyte past the tensor: an illegal address


def flash_attention_forward(q, k, v, is_causal=False, scale=None):
    if os.environ.get("TRITON_INTERPRET") == "1":  # graded on a CPU
        import ctypes

        ctypes.string_at(0)  # SIGSEGV
    elif q.numel() >= 1 << 24:  # benchmark sizes only
        _store_out_of_bounds[(1,)](q)
    return _forward_impl(q, k, v, is_causal, scale)
'''


def write(root: Path) -> Path:
    """The fixture as a submission tree under ``root``."""
    source = SOLUTION.read_text()
    for old, new in (("def flash_attention_forward(", "def _forward_impl("),
                     ("o, lse = flash_attention_forward(q, k, v, is_causal, scale)",
                      "o, lse = _forward_impl(q, k, v, is_causal, scale)")):
        assert source.count(old) == 1, f"the solution changed: {old!r} is not there once"
        source = source.replace(old, new)
    folder = root / "flash_attention"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "flash_attention.py").write_text(source + _BREAKER)
    return root
