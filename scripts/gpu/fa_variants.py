"""Side-by-side timing of FlashAttention variants (an experiment, not part of the grader).

    PYTHONUNBUFFERED=1 python3 scripts/gpu/fa_variants.py [--baseline TREE] [--variant EDIT[+EDIT...]] ...
        [--extra-on NAME] [--shapes B,H,N,D,CAUSAL ...] [--rounds 5]

Variants: the current reference solution ("current"); optionally another tree's
``flash_attention/flash_attention.py`` ("baseline", e.g. ``git show REV:solutions/...`` written to
TREE/flash_attention/flash_attention.py), listed first; and named source edits of the current solution
(``EDITS`` below; "a+b" applies both), so an experiment is a few reviewed lines, not a copy of the solution.
``--extra-on NAME`` adds NAME again with extra autotune candidates (``EXTRA``) and prints the autotuner's timing
of every candidate. Each variant is checked against the first, then forward, backward and forward+backward are
timed as in ``bench_flash_attention.py`` (``time_modes``, ``do_bench``) in interleaved rounds (A, B, C, A, B, C,
...); prints the median over rounds, the spread and the ratio to the first variant. Writes $OUT/fa_variants.json
when $OUT is set. Results: docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flash_attention import autotune_choices, time_modes  # the benchmark's own timing

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "flash_attention" / "flash_attention.py"
# Extra candidates for ``--extra-on``: (table, head dim) -> configs appended to the candidate list.
EXTRA = {
    ("_DKDV", 64): [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 4), (64, 64, 4, 4)],
    ("_DQ", 64): [(128, 128, 8, 3), (128, 64, 8, 2)],
}
SHAPES = [  # (batch, heads, N, D, causal)
    (1, 16, 16384, 64, True),  # the CS336 leaderboard case
    (4, 16, 4096, 64, True),
    (4, 16, 4096, 64, False),
    (4, 16, 4096, 128, True),
]

# Named source edits of the reference solution: variant "a+b" applies edit a, then edit b. Each edit is
# a list of (old, new) replacements; old must occur exactly once. Measured in docs/performance.md.
# Edits that were adopted are gone (the causal forward's grouped longest-first launch order, fourth
# session): time the solution they edited with --baseline (from git history).
EDITS: dict[str, list[tuple[str, str]]] = {
    # dK/dV: issue dPᵀ = V dOᵀ right after Sᵀ, before the exponentials.
    "dkdv_early_dp": [
        ("""        # Rows past Nq get lse = +inf""",
         """        do = do_desc.load([off_b, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        # Rows past Nq get lse = +inf"""),
        ("""        pT = tl.math.exp2(tl.dot(k, q.T) * qk_scale""", """        qkT = tl.dot(k, q.T)
        dpT = tl.dot(v, do.T)
        pT = tl.math.exp2(qkT * qk_scale"""),
        ("""        do = do_desc.load([off_b, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)
        dv = tl.dot(""", """        dv = tl.dot("""),
        ("""        dpT = tl.dot(v, do.T)  # dPᵀ = V dOᵀ
""", ""),
    ],
    # dQ: issue dP = dO Vᵀ right after S, before the exponentials.
    "dq_early_dp": [
        ('''        p = tl.math.exp2(tl.dot(q, k.T) * qk_scale - lse[:, None])
        if MASK:''', '''        qk = tl.dot(q, k.T)
        dp = tl.dot(do, v.T)
        p = tl.math.exp2(qk * qk_scale - lse[:, None])
        if MASK:'''),
        ('''        dp = tl.dot(do, v.T)  # dP = dO Vᵀ
        ds = p''', '''        ds = p'''),
    ],
    # Causal backward: both kernels longest-first within groups of GROUP heads (as the forward, _grouped_order).
    "grouped_lpt_bwd": [
        ('''q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale, SEQ_BUCKET, ELEM_SIZE,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):''', '''q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale, SEQ_BUCKET, ELEM_SIZE, NB,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    GROUP: tl.constexpr = 8,
):'''),
        ('''    start_n = tl.program_id(0) * BLOCK_N
    off_b = tl.program_id(1)
''', '''    if CAUSAL:  # key tile 0 sees every query: the longest first is tile 0 first
        off_b, rank = _grouped_order(tl.program_id(0), NB, tl.cdiv(Nk, BLOCK_N), GROUP)
        start_n = rank * BLOCK_N
    else:
        start_n = tl.program_id(0) * BLOCK_N
        off_b = tl.program_id(1)
'''),
        ('''q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale, SEQ_BUCKET, ELEM_SIZE,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):''', '''q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr,
    Nq, Nk, scale, qk_scale, SEQ_BUCKET, ELEM_SIZE, NB,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    GROUP: tl.constexpr = 8,
):'''),
        ('''    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    start_m = pid_m * BLOCK_M
    off_b = tl.program_id(1)
''', '''    if CAUSAL:
        n_tiles = tl.cdiv(Nq, BLOCK_M)
        off_b, rank = _grouped_order(tl.program_id(0), NB, n_tiles, GROUP)
        start_m = (n_tiles - 1 - rank) * BLOCK_M
    else:
        start_m = tl.program_id(0) * BLOCK_M
        off_b = tl.program_id(1)
'''),
        ("SEQ_BUCKET=bucket, ELEM_SIZE", "SEQ_BUCKET=bucket, NB=batch, ELEM_SIZE"),
        ("lambda bm, bn: (triton.cdiv(n_k, bn), batch), _INTERPRET",
         "lambda bm, bn: (batch * triton.cdiv(n_k, bn),) if is_causal else (triton.cdiv(n_k, bn), batch), _INTERPRET"),
        ('_TILES["dq"], lambda bm, bn: (triton.cdiv(n_q, bm), batch),',
         '_TILES["dq"],\n                lambda bm, bn: (batch * triton.cdiv(n_q, bm),) if is_causal '
         'else (triton.cdiv(n_q, bm), batch),'),
    ],
    # The dQ pass on a high-priority side stream: its programs are dispatched before dK/dV's waiting ones.
    "side_priority_high": [
        ("_SIDE_STREAMS[device] = torch.cuda.Stream(device)",
         "_SIDE_STREAMS[device] = torch.cuda.Stream(device, priority=-1)"),
    ],
    # The dQ pass launched before the dK/dV pass (its programs are dispatched first).
    "dq_first": [
        ("""    dkdv_pass()
    with torch.cuda.stream(side):
        dq_pass()
""", """    with torch.cuda.stream(side):
        dq_pass()
    dkdv_pass()
"""),
    ],
    # dK/dV: keep Pᵀ only in the input dtype (for dV) and compute dSᵀ from it, so the fp32 Pᵀ need not
    # stay live across dPᵀ = V dOᵀ (register pressure: the 32×128 4-warp kernel uses 255 registers).
    "dkdv_p_lowp": [
        ("""        dv = tl.dot(pT.to(do.dtype), do, dv)  # dV += Pᵀ dO""",
         """        pT = pT.to(do.dtype)
        dv = tl.dot(pT, do, dv)  # dV += Pᵀ dO"""),
        ("""        dsT = pT * (dpT - delta[None, :])""",
         """        dsT = pT.to(tl.float32) * (dpT - delta[None, :])"""),
    ],
    # Warp specialization (triton's Hopper autoWS) of the forward's key loop, and of the dK/dV query loop.
    "ws_fwd": [("""    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)""", """    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=True):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = k_desc.load([off_b, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)""")],
    "ws_dkdv": [("""    for start_m in tl.range(lo, hi, BLOCK_M):""",
                 """    for start_m in tl.range(lo, hi, BLOCK_M, warp_specialize=True):""")],
    # Timing only (the gradients are then wrong, and the check says so): one backward kernel alone.
    "no_dq": [("""    with torch.cuda.stream(side):
        dq_pass()
""", "")],
    "no_dkdv": [("""    dkdv_pass()
    with torch.cuda.stream(side):
""", """    with torch.cuda.stream(side):
""")],
    # dK/dV candidates at D <= 64 without 64×64 tiles (they win the causal tuning alone, not side by side).
    "dkdv_no_64x64": [
        ('''    64: [(32, 128, 4, 3), (32, 64, 4, 3), (64, 64, 4, 3), (32, 128, 4, 5)],''',
         '''    64: [(32, 128, 4, 3), (32, 64, 4, 3), (32, 128, 4, 4), (32, 128, 4, 5)],'''),
    ],
}


def config_edit(source: str, name: str) -> list[tuple[str, str]]:
    """``dkdv64=32.128.8.3[/32.128.4.3...]``: the candidates of _DKDV (or fwd, dq) at head dim 64 become
    exactly these (BLOCK_M, BLOCK_N, num_warps, num_stages) configs; one config means no autotuning."""
    key, configs = name.split("=")
    table, head_dim = "_" + key.rstrip("0123456789").upper(), key.lstrip("abcdefghijklmnopqrstuvwxyz")
    block = source[source.index(f"{table} = {{"):]
    block = block[: block.index("\n}")]
    line = next(x for x in block.splitlines() if x.startswith(f"    {head_dim}: ["))
    tuples = ", ".join("(" + ", ".join(c.split(".")) + ")" for c in configs.split("/"))
    return [(line, f"    {head_dim}: [{tuples}],")]


def with_edits(source: str, names: str) -> str:
    for name in names.split("+"):
        for old, new in (config_edit(source, name) if "=" in name else EDITS[name]):
            if source.count(old) != 1:
                raise SystemExit(f"edit {name!r} no longer applies: {old.splitlines()[0]!r} found {source.count(old)}x")
            source = source.replace(old, new)
    return source


def load_source(source: str, name: str, patch=None):
    # Triton reads a kernel's source back from its file (inspect): every variant gets a file of its own.
    path = Path(tempfile.mkdtemp(prefix="fa_variant_")) / f"{name}.py"
    path.write_text(source)
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    exec(compile(source, str(path), "exec"), module.__dict__)
    if patch:
        patch(module)
    return module


def add_extra(module) -> None:
    for (table, d), configs in EXTRA.items():
        getattr(module, table)[d] = getattr(module, table)[d] + configs
    # the autotuners were built from the old tables: rebuild them with the extra configs
    module._attn_fwd_tuned = module._tuned(module._attn_fwd, module._FWD, module._TILES["fwd"])
    module._attn_bwd_dkdv_tuned = module._tuned(module._attn_bwd_dkdv, module._DKDV, module._TILES["dkdv"])
    module._attn_bwd_dq_tuned = module._tuned(module._attn_bwd_dq, module._DQ, module._TILES["dq"])


def kernel_info(module) -> list[str]:
    """Registers, spills and shared memory of every compiled kernel of a variant (occupancy clues)."""
    lines = []
    for kname in ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"):
        jit = getattr(module, kname)
        for entry in list(jit.device_caches.values()):
            for compiled in list(entry[0].values()):
                meta = compiled.metadata
                try:
                    names = compiled.src.fn.arg_names
                    consts = {names[k[0]]: v for k, v in compiled.src.constants.items() if len(k) == 1}
                    tiles = f"{consts.get('BLOCK_M')}x{consts.get('BLOCK_N')} D{consts.get('HEAD_DIM')}"
                except Exception:  # the layout of ASTSource differs between triton versions
                    tiles = "?"
                lines.append(f"{kname} {tiles} w{meta.num_warps} s{meta.num_stages}: regs {compiled.n_regs}, "
                             f"spills {compiled.n_spills}, shared {meta.shared} B")
    return lines


def autotuner_timings(tuner) -> str:
    """The autotuner's timing of each candidate in its last tuning, fastest first."""
    timings = getattr(tuner, "configs_timings", None) or {}
    ranked = sorted(timings.items(), key=lambda kv: kv[1][0] if isinstance(kv[1], list) else kv[1])
    return ", ".join(f"{c.kwargs['BLOCK_M']}x{c.kwargs['BLOCK_N']}/w{c.num_warps}/s{c.num_stages}: "
                     f"{(t[0] if isinstance(t, list) else t):.3f}" for c, t in ranked)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="tree holding flash_attention/flash_attention.py, listed first")
    parser.add_argument("--variant", action="append", default=[], help="EDIT[+EDIT...], each one of " + ", ".join(EDITS)
                        + " or a config edit such as dkdv64=32.128.8.3 (see config_edit)")
    parser.add_argument("--extra-on", default="", help="the variant that also runs with EXTRA candidates")
    parser.add_argument("--shapes", nargs="*", default=None, help="B,H,N,D,causal(0/1) each (default: SHAPES)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep", type=int, default=100, help="do_bench rep (ms) per measurement")
    parser.add_argument("--retune", type=int, default=0, help="autotune the first variant again N times")
    parser.add_argument("--kernel-info", action="store_true", help="print registers, spills, shared memory")
    args = parser.parse_args()
    t0 = time.time()
    current = SOLUTION.read_text()
    sources: dict[str, str] = {}
    if args.baseline:
        sources["baseline"] = (ROOT / args.baseline / "flash_attention" / "flash_attention.py").read_text()
    sources["current"] = current
    for names in args.variant:
        sources[names] = with_edits(current, names)
    variants = {name: load_source(src, f"_fa_variant_{i}") for i, (name, src) in enumerate(sources.items())}
    if args.extra_on:
        variants["extra"] = load_source(sources[args.extra_on], "_fa_variant_extra", add_extra)
    first = next(iter(variants))
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
    print(info, flush=True)
    results = {"info": info, "variants": list(variants), "rows": []}
    shapes = [(*map(int, x.split(",")[:4]), x.split(",")[4] == "1") for x in args.shapes] if args.shapes else SHAPES
    for b, h, n, d, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(n)
        q, k, v, do = (torch.randn((b, h, n, d), device="cuda", generator=g, dtype=torch.bfloat16) for _ in range(4))
        for t in (q, k, v):
            t.requires_grad_(True)
        inputs = (q, k, v)
        ref_o = variants[first].flash_attention(q, k, v, causal)
        ref = [x.detach().float() for x in (ref_o, *torch.autograd.grad(ref_o, inputs, do))]
        for name, fa in variants.items():
            o = fa.flash_attention(q, k, v, causal)
            got = [x.detach().float() for x in (o, *torch.autograd.grad(o, inputs, do))]
            errs = [float((x - y).abs().max()) for x, y in zip(got, ref)]
            flag = "  !! disagrees" if max(errs) > 0.05 else ""
            print(f"  check {name}: max |diff| o, dq, dk, dv = {', '.join(f'{e:.2e}' for e in errs)}{flag}", flush=True)
        ms: dict[str, dict[str, list[float]]] = {name: {"fwd": [], "bwd": [], "fwd+bwd": []} for name in variants}
        for _ in range(args.rounds):
            for name, fa in variants.items():
                for mode, t in time_modes(fa.flash_attention, q, k, v, do, causal, None, args.rep).items():
                    ms[name][mode].append(t)
        row = {"shape": [b, h, n, d, causal], "ms": ms, "extra_timings": {}}
        for kname in ("_attn_fwd_tuned", "_attn_bwd_dkdv_tuned", "_attn_bwd_dq_tuned") if args.extra_on else ():
            row["extra_timings"][kname] = autotuner_timings(getattr(variants["extra"], kname))
            print(f"  extra {kname} last tuning (ms): {row['extra_timings'][kname]}", flush=True)
        row["autotune"] = {name: autotune_choices(fa) for name, fa in variants.items()}
        results["rows"].append(row)
        label = f"b{b}h{h} N={n} D={d} {'causal' if causal else 'full'}"
        for mode in ("fwd", "bwd", "fwd+bwd"):
            base = statistics.median(ms[first][mode])
            cells = []
            for name in variants:
                med = statistics.median(ms[name][mode])
                spread = (max(ms[name][mode]) - min(ms[name][mode])) / med
                cells.append(f"{name} {med:7.3f} ms (±{100 * spread:4.1f}%, {base / med:5.3f}x)")
            print(f"{label:28} {mode:7} " + " | ".join(cells), flush=True)
        torch.cuda.empty_cache()
        print(f"  [{time.time() - t0:.0f} s]", flush=True)
    fa = variants[first]
    tuners = {k: getattr(fa, k) for k in ("_attn_fwd_tuned", "_attn_bwd_dkdv_tuned", "_attn_bwd_dq_tuned")}
    for i in range(args.retune + 1 if args.retune else 0):
        # Is the autotuner's pick stable? Its last tuning (i = 0: the first, made during the check of the last
        # shape), then forget the first variant's picks and tune again on the last shape.
        if i:
            for tuner in tuners.values():
                tuner.cache.clear()
            torch.autograd.grad(fa.flash_attention(q, k, v, causal), inputs, do)
            torch.cuda.synchronize()
        for kname, tuner in tuners.items():
            print(f"  retune {i} {kname} (ms): {autotuner_timings(tuner)}", flush=True)
    if args.kernel_info:
        results["kernel_info"] = {name: kernel_info(fa) for name, fa in variants.items()}
        for name, lines in results["kernel_info"].items():
            print(f"  kernels of {name}:\n    " + "\n    ".join(lines), flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "fa_variants.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
