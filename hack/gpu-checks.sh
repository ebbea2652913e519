#!/usr/bin/env bash
# The checks that need a GPU, as one script for a lent GPU machine (docs/development.md,
# "GPU checks") or any CUDA host: the gpu-marked tests, then what the in-memory restore point
# costs a GPU training loop (bench/restore_point_overhead.py --gpu), with this tree's runtime
# and, where a second runtime directory is given (an older commit's, from `git archive`),
# with that one too, on the same machine in the same call.
#
#   hack/gpu-checks.sh [OLD_RUNTIME_DIR]
#   STATE_MIB=4096 ROWS=8192 STEPS=40 WARMUP=8 REPEATS=2 GPU_TESTS=tests/gpu hack/gpu-checks.sh
#
# Python packages the machine lacks (pydantic on the lent H200's image) travel as wheels in
# .whl/ and are installed into /tmp/site. Writes its outputs under $OUT (default /tmp/gpu-checks).
set -uo pipefail
OUT=${OUT:-/tmp/gpu-checks}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a "$OUT/gpu.txt"

# shellcheck disable=SC2086  # GPU_TESTS may name several paths
PYTHONPATH=runtime:.:${PYTHONPATH:-} "$PY" -m pytest -p no:cacheprovider -o addopts="" -q -m gpu \
  ${GPU_TESTS:-tests/gpu} 2>&1 | tee "$OUT/gpu-tests.txt"

bench=(--gpu --loops "${LOOPS:-plain,report,restore point,restore point k=1}" --workers 1 --state-mib "${STATE_MIB:-4096}" --rows "${ROWS:-8192}"
  --step-seconds 0 --steps "${STEPS:-40}" --warmup "${WARMUP:-8}" --repeats "${REPEATS:-2}")
for rt in runtime ${1:-}; do
  label=this
  [ "$rt" = runtime ] || label=$(echo "$rt" | tr -c 'A-Za-z0-9\n' '-')
  (cd bench && PYTHONPATH="$PWD/../$rt:$PWD/..:${PYTHONPATH:-}" "$PY" restore_point_overhead.py "${bench[@]}") 2>&1 \
    | grep -v -e '^\[torchjob\]' -e '━' | tee "$OUT/overhead-$label.txt"
done
