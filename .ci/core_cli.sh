#!/usr/bin/env bash
# The core install alone (`pip install .`, no extras: no pyarrow, Ray, TRL, pytest): the command line end to end
# as a user runs it (train, resume, eval, grid, report on a grid of this run and on a committed grid, one bad input).
# `make test-core` runs it with that environment's bin/ first on PATH; any failure fails CI. Tiny settings: ~2 min.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -c 'import satrl, importlib.util as u; print("satrl from", satrl.__file__, "| pyarrow:", u.find_spec("pyarrow") is not None)'
TINY=(train.prompts_per_batch=4 train.group_size=4 train.minibatches=2 train.threads=1 engine.max_new_tokens=5
      eval.val_problems=2 eval.test_problems=2 eval.k=2 eval.every=2 checkpoint.every=1)
satrl --help > /dev/null
# default backend (local): the engine in its own process
satrl train configs/sat_grpo.yaml "${TINY[@]}" steps=4 out="$work/run" --no-progress
test -s "$work/run/summary.json"
satrl train configs/grpo.yaml "${TINY[@]}" steps=4 backend=sequential out="$work/seq" --no-progress
rm "$work/seq/summary.json"  # as if killed after its last checkpoint
satrl train --resume "$work/seq" --no-progress
test -s "$work/seq/summary.json"
satrl eval --model tiny-arith --n-problems 8 --k 2 --max-new-tokens 5 --json
satrl grid configs/grids/ci_smoke.yaml --workers 2 --out "$work/ci_smoke"
satrl report "$work/ci_smoke" --resamples 200
# a committed grid: the report must build without pyarrow (it once ended in KeyError: 0 here)
satrl report docs/results/paper_table --out "$work/paper_table" --resamples 200
test -s "$work/paper_table/report.md"
set +e
satrl train train.lr=inf 2> "$work/err"
rc=$?
set -e
if [ "$rc" -ne 2 ] || [ "$(wc -l < "$work/err")" -ne 1 ]; then
  echo "bad input: expected exit 2 and one line, got exit $rc:"; cat "$work/err"; exit 1
fi
echo "core install: CLI end to end OK"
