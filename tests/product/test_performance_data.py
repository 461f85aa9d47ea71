"""docs/data/*.csv parse with their columns, and docs/performance.md shows the tables the data draws."""

import csv
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("performance_tables", ROOT / "scripts" / "performance_tables.py")
tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tables)

NUMERIC = {
    "machines.csv": ["copy_gb_s", "matmul_bf16_tflop_s", "matmul_fp16_tflop_s", "matmul_tf32_tflop_s"],
    "reference-speed.csv": ["reference_ms", "baseline_ms", "ratio", "achieved", "roofline_pct", "full_credit_at"],
    "replay-vs-call.csv": ["replayed_ms", "in_process_ms", "baseline_ms", "ratio_replayed", "ratio_in_process",
                           "difference_pct"],
    "grading-history.csv": ["order", "wall_s_min", "wall_s_max"],
    "gpu-sharing-ab.csv": ["wall_s", "alone_s", "drain_s", "queue_s"],
}


def test_every_data_file_is_known():
    assert sorted(p.name for p in tables.DATA.glob("*.csv")) == sorted(tables.COLUMNS)


@pytest.mark.parametrize("name", sorted(tables.COLUMNS))
def test_csv_has_its_columns(name):
    with open(tables.DATA / name, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    assert rows[0] == tables.COLUMNS[name]
    assert len(rows) > 1
    for row in rows[1:]:
        assert len(row) == len(rows[0]), row
        if "date" in rows[0] and row[rows[0].index("date")]:
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row[rows[0].index("date")]), row
    for column in NUMERIC.get(name, []):
        k = rows[0].index(column)
        for row in rows[1:]:
            float(row[k])


def test_reference_speed_covers_both_gpus():
    rows = tables.read("reference-speed.csv")
    by_gpu = {gpu: {(r["part"], r["benchmark"]) for r in rows if r["gpu"] == gpu} for gpu in ("H100", "H200")}
    assert by_gpu["H100"] == by_gpu["H200"]
    assert len(by_gpu["H100"]) == 19
    for r in rows:  # the ratio (a median over repeats) is about the baseline's time over the reference's
        assert float(r["baseline_ms"]) / float(r["reference_ms"]) == pytest.approx(float(r["ratio"]), rel=0.01), r


@pytest.mark.parametrize("page", tables.DOCS, ids=lambda p: p.name)
def test_page_shows_what_the_data_draws(page):
    doc = page.read_text(encoding="utf-8")
    marked = re.findall(r"^<!-- table: ([\w-]+) -->$", doc, flags=re.M)
    assert marked and len(marked) == len(set(marked))
    assert set(marked) <= set(tables.TABLES)
    assert tables.render(doc) == doc, "run: python scripts/performance_tables.py --write"


def test_page_keeps_the_sections_code_cites():
    titles = set(re.findall(r"^#+ (.+)$", tables.DOC.read_text(encoding="utf-8"), flags=re.M))
    assert "Grading time" in titles


def test_cited_decision_records_exist():
    cited = set()
    for path in [*ROOT.glob("grader/**/*.py"), *ROOT.glob("grader/**/*.md"), *ROOT.glob("docs/*.md")]:
        cited |= set(re.findall(r"docs/decisions/[\w.-]+\.md", path.read_text(encoding="utf-8")))
    assert cited
    for doc in cited:
        assert (ROOT / doc).is_file(), doc


def test_an_unknown_table_is_refused_with_the_names_of_the_tables(capsys):
    with pytest.raises(SystemExit) as exit_:
        tables.main(["grading-histroy"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "no table named grading-histroy" in err and "grading-history" in err
