#!/usr/bin/env bash
# One accelerator run of the GPU issue: bench/accelerator.py, then the device-independent
# tests on the GPU. Everything it measures goes to $OUT (default
# results/device_runs/<date>_<commit>/; add the device to the name when you commit it).
#
#   bash bench/device_run.sh            # on the GPU machine, from the repository root
#   TINY=1 bash bench/device_run.sh     # CPU dry run: tiny shapes, the same steps
#
# Expects beside the checkout (git-ignored, carried to the device machine):
#   .whl/             Python 3.12 wheels of grain, array_record, ml_collections,
#                     tensorboardX, portpicker (the image lacks them)
#   .device/multi30k  the Multi30k .gz files; .device/peer: Flax examples/wmt's
#                     models.py and decode.py (the peer)
set -u -o pipefail
OUT=${OUT:-results/device_runs/$(date +%F)_$(git rev-parse --short HEAD)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(pwd)
if [ -d .whl ] && [ -z "${TINY:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$ROOT
fi
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
(nvidia-smi -L 2>&1 || true; $PY -c 'import jax; print(jax.__version__, jax.devices())') \
  > "$OUT/device.txt" 2>&1
SCRATCH=/tmp/device_run
rm -rf "$SCRATCH"
BENCH_LIMIT=${BENCH_LIMIT:-400}
TEST_LIMIT=${TEST_LIMIT:-130}
timeout "$BENCH_LIMIT" $PY bench/accelerator.py ${TINY:+--tiny} --peer_path=.device/peer \
  --data="$ROOT/.device/multi30k" --scratch="$SCRATCH" --out="$OUT/accelerator.json" \
  --budget_s=$((BENCH_LIMIT - 20)) 2>&1 | tee "$OUT/bench.log" | tail -40
# The device-independent tests on this device (cpu beside cuda: jax.debug.callback needs it;
# tests/conftest.py: full-precision float32 matmuls, tests that need 8 devices skipped).
GPU_TESTS="tests/test_attention.py tests/test_model.py tests/test_paper.py tests/test_recipe.py
  tests/test_compilation.py tests/test_decoding.py"
# SIGINT at the limit: pytest then still prints the failures and the summary so far.
JAX_PLATFORMS=${TEST_PLATFORM:-cuda,cpu} MULTI30K_DIR="$ROOT/.device/multi30k" \
  timeout -s INT -k 20 "$TEST_LIMIT" $PY -m pytest -v --tb=short -rfEs -p no:cacheprovider \
  $GPU_TESTS > "$OUT/tests.log" 2>&1
echo "tests exit $?" >> "$OUT/tests.log"
tail -30 "$OUT/tests.log"
(cd "$SCRATCH" && tar czf "$OUT/logs.tgz" --ignore-failed-read *.log *.hyp \
  readme/metrics.jsonl readme/run.json readme_warm/run.json 2>/dev/null)
ls -la "$OUT"
