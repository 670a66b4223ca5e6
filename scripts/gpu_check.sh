#!/usr/bin/env bash
# The CUDA path in one run (issue 16): the CUDA tests, then drafter step / verification / end-to-end timings on
# random targets of real shapes with the shipped drafters. Needs only this tree: no network, no model download.
#   scripts/gpu_check.sh OUTDIR          on a CUDA GPU (under 8 minutes)
#   scripts/gpu_check.sh OUTDIR --cpu    dry run on a tiny target (CI runs it)
# Writes OUTDIR/gpu_check.md, OUTDIR/gpu_check.json and OUTDIR/cuda_tests.log; exits 1 on any failure.
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then  # no OUTDIR, or an option in its place
    echo "usage: scripts/gpu_check.sh OUTDIR [--cpu]" >&2
    exit 2
fi
outdir=$(mkdir -p "$1" && cd "$1" && pwd)  # before the cd below: a relative OUTDIR is the caller's
shift
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3  # a GPU machine without the project's venv
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" -m specdec.gpu_check "$outdir" "$@"
