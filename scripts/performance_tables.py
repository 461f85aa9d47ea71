"""Draw the tables of docs/performance.md from the measurements in docs/data/*.csv.

    python scripts/performance_tables.py             # print every table, each after its marker
    python scripts/performance_tables.py NAME ...    # print the named tables only
    python scripts/performance_tables.py --write     # put the tables into docs/performance.md
    python scripts/performance_tables.py --check     # exit 1 if docs/performance.md differs

In docs/performance.md each generated table follows a line `<!-- table: NAME -->`; everything from that line to the
end of the table (the lines that start with `|`) is this script's. A new measurement is a new row in a CSV, then
`--write`. tests/product/test_performance_data.py fails while the page and the data disagree.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"
DOC = ROOT / "docs" / "performance.md"
DOCS = (DOC, ROOT / "docs" / "trusted-timer.md")  # the pages whose marked tables are drawn from the data
MARKER = re.compile(r"^<!-- table: ([\w-]+) -->$")

# The columns each CSV must have, in this order.
COLUMNS: dict[str, list[str]] = {
    "machines.csv": ["date", "gpu", "copy_gb_s", "matmul_bf16_tflop_s", "matmul_fp16_tflop_s", "matmul_tf32_tflop_s",
                     "torch", "triton"],
    "reference-speed.csv": ["date", "gpu", "torch", "triton", "part", "benchmark", "reference_ms", "baseline",
                            "baseline_ms", "ratio", "achieved", "achieved_unit", "roofline_pct", "full_credit_at"],
    "replay-vs-call.csv": ["date", "gpu", "command", "rounds", "part", "benchmark", "replayed_ms", "in_process_ms",
                           "baseline_ms", "ratio_replayed", "ratio_in_process", "difference_pct"],
    "profile-vs-bench.csv": ["date", "gpu", "calls", "part", "benchmark", "candidate", "profile_sum_us",
                             "profile_span_us", "bench_us", "profile_over_bench", "ratio_of"],
    "slow-fixture-credit.csv": ["date", "part", "reference_credit", "extra_15pct_credit_pct_h100",
                                "extra_15pct_credit_pct_h200"],
    "forged-timing.csv": ["date", "gpu", "fixture", "forgery", "speed_credit", "gelu_points", "flag"],
    "grading-time.csv": ["date", "gpu", "gpus", "cores", "host", "tree", "what", "runs_at_once", "wall_s",
                         "command_s", "per_submission_s", "gpu_alone_s", "note"],
    "grading-projection.csv": ["setup", "basis", "submissions", "projected"],
    "grading-history.csv": ["order", "tree", "what", "host", "gpu", "wall_s_min", "wall_s_max", "note"],
    "grading-runs.csv": ["date", "when", "block", "table", "row", "run", "host", "column", "value"],
    "grading-notes.csv": ["date", "when", "block", "n", "text"],
    "yardstick-runs.csv": ["date", "gpu", "torch", "triton", "machine", "submission", "part", "benchmark",
                           "x_reference", "x_reference_low", "x_reference_high", "x_baseline", "credit", "rounds"],
    "gpu-sharing-ab.csv": ["date", "commit", "gpu", "arm", "grader_commit", "grader_args", "batch", "submissions",
                           "wall_s", "scores", "alone_s", "turns", "chained", "drain_s", "queue_s", "exit", "cores",
                           "note"],
}

SHORT_GPU = {"NVIDIA H100 80GB HBM3": "H100", "NVIDIA H200": "H200"}


def read(name: str) -> list[dict[str, str]]:
    with open(DATA / name, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def md(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def span(values: list[str], unit: str = "") -> str:
    """'a' or 'a–b' (min–max of the values, each printed as it is in the data)."""
    values = [v for v in values if v]
    if not values:
        return "–"
    lo, hi = min(values, key=float), max(values, key=float)
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def machines() -> list[str]:
    rows = [[r["gpu"], f"{r['copy_gb_s']} GB/s",
             f"{r['matmul_bf16_tflop_s']} / {r['matmul_fp16_tflop_s']} / {r['matmul_tf32_tflop_s']} TFLOP/s",
             r["torch"], r["triton"], r["date"]] for r in read("machines.csv")]
    return md(["GPU", "copy bandwidth", "matmul bf16 / fp16 / fp32 (TF32)", "torch", "triton", "measured"], rows)


def reference(part: str) -> Callable[[], list[str]]:
    def table() -> list[str]:
        data = [r for r in read("reference-speed.csv") if r["part"] == part]
        rows = [[r["benchmark"], r["gpu"], f"{r['reference_ms']} ms", f"{r['baseline_ms']} ms", f"{r['ratio']}×",
                 f"{r['achieved']} {r['achieved_unit']}", f"{r['roofline_pct']} %", f"{r['full_credit_at']}×"]
                for r in data]
        return md(["benchmark", "GPU", "reference", data[0]["baseline"], "ratio", "achieved", "% roofline",
                   "full credit at"], rows)
    return table


def leaderboard() -> list[str]:
    rows = []
    for r in read("reference-speed.csv"):
        if r["part"] == "flash_attention.autograd" and r["benchmark"].startswith("cs336"):
            gpu = "H100 80GB HBM3" if r["gpu"] == "H100" else r["gpu"]
            rows.append([gpu, f"{float(r['reference_ms']):.2f} ms", f"{float(r['baseline_ms']):.2f} ms",
                         f"{r['ratio']}×", "–"])
    return md(["GPU", "reference", "sdpa-flash", "ratio", "sdpa-cudnn"], rows)


def replay_vs_call(gpu: str) -> Callable[[], list[str]]:
    def table() -> list[str]:
        rows = []
        for r in read("replay-vs-call.csv"):
            if r["gpu"] != gpu:
                continue
            d = r["difference_pct"]
            d = d.replace("-", "−") if d.startswith("-") else "+" + d
            rows.append([r["part"], r["benchmark"], r["replayed_ms"], r["in_process_ms"], r["baseline_ms"],
                         r["ratio_replayed"], r["ratio_in_process"], f"{d} %"])
        return md(["part", "benchmark", "replayed", "in-process", "baseline", "ratio, replayed",
                   "ratio, in-process", "difference"], rows)
    return table


def _us(v: str) -> str:
    return f"{v} µs" if v else "–"


def profile_queued() -> list[str]:
    rows = []
    for r in read("profile-vs-bench.csv"):
        if r["calls"] != "queued whole":
            continue
        span_ = r["profile_span_us"]
        q = r["profile_over_bench"] or "–"
        if r["ratio_of"] == "span":
            span_, q = f"**{span_} µs**", f"**{q}** (span)"
        else:
            span_ = _us(span_)
        rows.append([r["part"], r["benchmark"], r["candidate"], _us(r["profile_sum_us"]), span_, _us(r["bench_us"]), q])
    return md(["part", "benchmark", "candidate", "profile: kernels added up", "profile: the call's span", "bench",
               "profile ÷ bench"], rows)


def profile_unqueued() -> list[str]:
    rows = []
    for r in read("profile-vs-bench.csv"):
        if r["calls"] == "queued whole":
            continue
        mark = "¹" if r["ratio_of"] else ""
        rows.append([r["part"], r["benchmark"], r["candidate"], _us(r["profile_sum_us"]), _us(r["bench_us"]) + mark,
                     r["profile_over_bench"]])
    return md(["part", "benchmark", "candidate", "profile: the call's kernels", "bench", "profile ÷ bench"], rows)


def slow_fixture_credit() -> list[str]:
    rows = [[r["part"], r["reference_credit"], f"{r['extra_15pct_credit_pct_h100']} %",
             f"{r['extra_15pct_credit_pct_h200']} %" if r["extra_15pct_credit_pct_h200"] else "–"]
            for r in read("slow-fixture-credit.csv")]
    return md(["part", "reference speed credit (3 gradings on each GPU)", "`extra_15pct` speed credit, H100", "H200"],
              rows)


def forged_timing() -> list[str]:
    rows = [[r["fixture"], r["forgery"], r["speed_credit"], r["gelu_points"], f"`{r['flag']}`" if r["flag"] else "–"]
            for r in read("forged-timing.csv")]
    return md(["fixture", "what it forges, in the student's process", "speed credit", "GeLU points", "flag"], rows)


def grading_time() -> list[str]:
    """One row per setup: hosts, runs at once, and the spans of the measured figures."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for r in read("grading-time.csv"):
        key = (r["what"], r["gpus"] + " × " + r["gpu"] if r["gpus"] not in ("0", "1") else r["gpu"], r["tree"])
        groups.setdefault(key, []).append(r)
    rows = []
    for (what, gpu, tree), rs in groups.items():
        hosts = ", ".join(dict.fromkeys(r["host"] for r in rs if r["host"])) or "–"
        runs = "/".join(sorted({r["runs_at_once"] for r in rs if r["runs_at_once"]})) or "–"
        if "–" in rs[0]["wall_s"]:
            wall = rs[0]["wall_s"] + " s"
        else:
            wall = span([r["wall_s"] for r in rs], " s")
        n = len(rs)
        rows.append([what, gpu, tree, hosts, runs, str(n), wall, span([r["per_submission_s"] for r in rs], " s"),
                     span([r["gpu_alone_s"] for r in rs], " s")])
    return md(["what", "GPU", "tree", "hosts", "runs at once", "measured", "wall time", "per submission",
               "GPU held alone"], rows)


def grading_projection() -> list[str]:
    data = read("grading-projection.csv")
    setups = list(dict.fromkeys(r["setup"] for r in data))
    counts = list(dict.fromkeys(r["submissions"] for r in data))
    cell = {(r["setup"], r["submissions"]): r["projected"] for r in data}
    return md(["submissions", *setups], [[n, *(cell.get((s, n), "–") for s in setups)] for n in counts])


def grading_history() -> list[str]:
    """Per tree, oldest first: the spans of one submission's and a batch of 10's wall time, with their hosts."""
    trees: dict[tuple[int, str], dict[str, list[dict[str, str]]]] = {}
    for r in read("grading-history.csv"):
        trees.setdefault((int(r["order"]), r["tree"]), {}).setdefault(r["what"], []).append(r)
    rows = []
    for (_, tree), by_what in sorted(trees.items()):
        out = [tree]
        for what in ("one submission", "batch of 10"):
            rs = by_what.get(what, [])
            if not rs:
                out.append("–")
                continue
            lo = min(rs, key=lambda r: float(r["wall_s_min"]))["wall_s_min"]
            hi = max(rs, key=lambda r: float(r["wall_s_max"]))["wall_s_max"]
            hosts = ", ".join(dict.fromkeys(r["host"] for r in rs))
            out.append(f"{lo if lo == hi else lo + '–' + hi} s ({hosts})")
        rows.append(out)
    return md(["tree (oldest first)", "one submission (hosts)", "batch of 10 (hosts)"], rows)


def _spread(values: list[float]) -> str:
    return f"{(max(values) - min(values)) / (sum(values) / len(values)) * 100:.1f} %"


def yardstick_spread() -> list[str]:
    """Per benchmark: the slowed fixtures' ratio to the reference timed beside them, and to the baseline, across
    every grading of them on every machine (min–max and spread), and the references' own ratio."""
    data = read("yardstick-runs.csv")
    keys = list(dict.fromkeys((r["part"], r["benchmark"]) for r in data))
    rows = []
    for key in keys:
        mine = [r for r in data if (r["part"], r["benchmark"]) == key]
        slowed = [r for r in mine if r["submission"].startswith("slowed")]
        refs = [r for r in mine if r["submission"].startswith("reference")]
        x_ref = [float(r["x_reference"]) for r in slowed]
        x_base = [float(r["x_baseline"]) for r in slowed]
        rows.append([key[0], key[1], f"{len(slowed)} on {len({r['machine'] for r in slowed})}",
                     span([r["x_reference"] for r in slowed]), _spread(x_ref),
                     span([r["x_baseline"] for r in slowed]), _spread(x_base),
                     span([r["credit"] for r in slowed]), span([r["x_reference"] for r in refs])])
    return md(["part", "benchmark", "slowed gradings (machines)", "slowed × reference", "spread",
               "slowed × baseline", "spread", "slowed speed credit", "reference × reference"], rows)


TABLES: dict[str, Callable[[], list[str]]] = {
    "machines": machines,
    "replay-vs-call-h100": replay_vs_call("H100"),
    "replay-vs-call-h200": replay_vs_call("H200"),
    "gelu": reference("gelu.forward"),
    "softmax": reference("softmax.forward"),
    "rmsnorm": reference("rmsnorm.forward"),
    "matmul": reference("matmul.forward"),
    "flash-attention-forward": reference("flash_attention.forward"),
    "flash-attention-autograd": reference("flash_attention.autograd"),
    "leaderboard": leaderboard,
    "profile-queued": profile_queued,
    "profile-unqueued": profile_unqueued,
    "slow-fixture-credit": slow_fixture_credit,
    "forged-timing": forged_timing,
    "grading-time": grading_time,
    "grading-projection": grading_projection,
    "grading-history": grading_history,
    "yardstick-spread": yardstick_spread,
}


def render(doc: str) -> str:
    """The page with every marked table redrawn from the data."""
    lines, out, i = doc.split("\n"), [], 0
    while i < len(lines):
        out.append(lines[i])
        m = MARKER.match(lines[i])
        i += 1
        if m:
            if m.group(1) not in TABLES:
                raise SystemExit(f"unknown table {m.group(1)!r}")
            while i < len(lines) and lines[i].startswith("|"):
                i += 1
            out += TABLES[m.group(1)]()
    return "\n".join(out)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tables", nargs="*", metavar="NAME", help="tables to print (default: all): "
                        + ", ".join(TABLES))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="put the tables into the pages that mark them")
    mode.add_argument("--check", action="store_true", help="exit 1 if a page differs from the data")
    args = parser.parse_args(argv)
    unknown = [name for name in args.tables if name not in TABLES]
    if unknown:
        parser.error(f"no table named {', '.join(unknown)}; the tables: {', '.join(TABLES)}")
    if args.write or args.check:
        if args.tables:
            parser.error("--write and --check take every table; name none")
        stale = []
        for page in DOCS:
            doc = page.read_text(encoding="utf-8")
            new = render(doc)
            if args.write:
                page.write_text(new, encoding="utf-8")
            elif new != doc:
                stale.append(page.relative_to(ROOT))
        for page in stale:
            print(f"{page} differs from the data: run scripts/performance_tables.py --write")
        return 1 if stale else 0
    for name in args.tables or TABLES:
        print(f"<!-- table: {name} -->")
        print("\n".join(TABLES[name]()))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
