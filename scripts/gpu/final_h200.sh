#!/usr/bin/env bash
# H200: FA calibration + speed criteria, time grading one full submission, staff pytest on CUDA.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
timeout 240 python3 scripts/gpu/speed_check.py --exercises flash_attention --limit-s 170 2>&1 | grep -vE "^\s*$" | tail -25
echo "== grade one full submission (solutions)"
start=$(date +%s)
timeout 200 python3 -m grader.cli grade solutions --out /tmp/grade 2>&1 | tail -15
echo "grade wall: $(( $(date +%s) - start )) s"
cp /tmp/grade/grades.csv $OUT/ 2>/dev/null; cp /tmp/grade/*/results.json $OUT/ 2>/dev/null
echo "== pytest assignments --impl solutions (CUDA)"
timeout 140 python3 -m pytest -p grader.plugin assignments --impl solutions -q --hypothesis-profile ci \
  -p no:cacheprovider -m "not speed" 2>&1 | tail -6
