#!/usr/bin/env bash
# `make test`: the whole suite as two pytest sessions at once.
#
#   cluster  tests/cluster: the control plane, the operator, the real node (mostly waiting on
#            the API server, kwok, kubelet and containers)
#   rest     tests/unit, tests/runtime, tests/gpu (mostly CPU: multi-process torch)
#
# Run one after the other they took about 6 + 8.5 minutes on 2 cores; side by side the
# waiting of one overlaps the computing of the other. Only the cluster session touches the
# cluster, so they share nothing but the machine (each has its own --basetemp). The output of
# each is prefixed with its name; the exit status is the worse of the two. Extra arguments go
# to both sessions (for example `hack/test.sh -x`). `make test-unit`, `make test-cluster`
# run one part alone.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
BASE="${TMPDIR:-/tmp}/torchjob-tests"
mkdir -p "${BASE}"

run() {
  local name="$1"
  shift
  "${PY}" -m pytest --basetemp="${BASE}/${name}" -o cache_dir=".pytest_cache/${name}" "$@" 2>&1 \
    | sed -u "s/^/[${name}] /"
  return "${PIPESTATUS[0]}"
}

start=$(date +%s)
run cluster tests/cluster "$@" &
cluster_pid=$!
rest_rc=0
run rest tests --ignore=tests/cluster "$@" || rest_rc=$?
cluster_rc=0
wait "${cluster_pid}" || cluster_rc=$?
echo "make test: rest (unit, runtime, gpu) exit ${rest_rc}; cluster exit ${cluster_rc}; $(($(date +%s) - start))s"
# pytest's 5 (nothing collected) is a failure too.
[[ "${rest_rc}" == 0 && "${cluster_rc}" == 0 ]]
