#!/usr/bin/env bash
# `make test`: the whole suite as five pytest sessions at once.
#
#   cluster   tests/cluster minus the files below: the operator against the control plane
#             (admission, CLI, leader election, Helm, Kueue, topology) on cluster `torchjob`
#   e2e       the real nodes (test_real_node, test_node_faults, test_real_nodes: kubelet +
#             containerd, real containers) on their own cluster `torchjob-e2e`
#             (TORCHJOB_CLUSTER_NAME), so that the sessions' cluster-wide operators never see
#             each other's jobs; 3 real nodes (TORCHJOB_REAL_NODES; TORCHJOB_E2E_REAL_NODES to
#             change), which the node-fault tests need and every other real-node test spreads
#             its pods over; and, last, the 200-job scale test (kwok nodes only). Not split in
#             two sessions on two clusters: tried (2026-12-02), the second cluster's 3 nodes
#             and operator slowed every session on 2 cores (rest 852 -> 1,190 s, runtime
#             704 -> 1,107 s, the real-node tests 1,336 -> 1,144 s at best) and a pods test
#             lost its timing margin
#   pods      the tests that train with torch in pods run by the process kubelet
#             (test_e2e_runtime), the operator SIGKILLed at random points (test_chaos), and the
#             real-node tests that need one node only (test_real_node_examples: the docs'
#             examples, an eviction), on their own cluster `torchjob-pods` with one real node
#             (started by the first test that needs it). Why: the cluster and e2e sessions
#             were each ~900 s of tests one after another while this one ended at ~450 s, and
#             the machine stood 30-60 % idle through the last 5 minutes of `make test`
#             (2026-12-03, twelfth session: vmstat of a warm CI). A real node costs no control
#             plane: its kubelet and containerd idle at a few per cent of a core.
#   rest      tests/unit, tests/gpu and tests/runtime/test_[a-r]* (mostly CPU: multi-process
#             torch)
#   runtime   tests/runtime/test_[s-z]*: the runtime suite alone was the long pole (1,111 s of
#             tests one after another, against 500 + 615 s in two sessions); much of a
#             multi-process test is waiting (a peer's loss, a re-formation, a timeout), so two
#             sessions overlap those waits. A file the glob misses stays in rest.
#
# The cluster tests mostly wait (on the API server, kwok, kubelet, containers); in one
# session they were the long pole (942 s against the rest's 709 s, side by side on 2 cores),
# so they are split in two that wait at the same time. Each session has its own --basetemp
# and cache dir; the output of each is prefixed with its name; the exit status is the worst
# of the five. Extra arguments go to every session (for example `hack/test.sh -x`).
# `make test-unit`, `make test-cluster` run one part alone.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
# The venv's packages are compiled once (`make venv`'s .bytecode), but with
# PYTHONDONTWRITEBYTECODE=1 (this machine's and CI's environment) every one of the suite's
# hundreds of processes (workers, drivers, CLI calls, operators) compiled this checkout's own
# modules from source again: about 0.5 s of CPU per torch worker (5.5 s against 6.0 s to import
# torchjob.train/launch/checkpoint, measured on the shared 2-core machine). Let the first
# process write them (__pycache__ is git-ignored and left out of the images' input hashes;
# writes are atomic, so the sessions may race).
unset PYTHONDONTWRITEBYTECODE
# The Go programs the sessions start (three or four control planes, the real nodes' kubelets
# and containerd, kubectl, helm) collect garbage at 4x their live heap instead of 2x: an API
# server under the cluster tests spent ~15 % less CPU (21 against 25 CPU-s for
# tests/cluster/test_operator.py and test_node_notice.py, 2026-12-03) for ~0.5 GB more.
export GOGC="${GOGC:-400}"
BASE="${TMPDIR:-/tmp}/torchjob-tests"
mkdir -p "${BASE}"

# TORCHJOB_TEST_TIME_SCALE (default 1; .ci/run sets 3) multiplies every wait's limit in the
# cluster tests (tests/kube.py) and pytest-timeout's 600 s per test: on a slow machine a limit
# only decides how long a failure takes to be reported.
SCALE="${TORCHJOB_TEST_TIME_SCALE:-1}"
PER_TEST_TIMEOUT="$(awk -v s="${SCALE}" 'BEGIN { t = 600 * (s < 1 ? 1 : s); printf "%d", t }')"
# The local worker groups' start limit (120 s by default: a worker that must import torch at a
# few per cent of a CPU, as the niced sessions get on a loaded CI machine, takes longer).
TORCHJOB_WORKER_START_TIMEOUT_S="${TORCHJOB_WORKER_START_TIMEOUT_S:-$(awk -v s="${SCALE}" 'BEGIN { t = 120 * (s < 1 ? 1 : s); printf "%d", t }')}"
export TORCHJOB_WORKER_START_TIMEOUT_S

# NICE=<n> run ...: the session's processes run at that niceness. The sessions that train with
# torch on the CPU (rest, runtime) keep both cores busy for minutes; niced, they yield to what
# the cluster sessions wait on (three API servers and etcds, kubelets, containerd, the pods and
# operators under test), whose latency decides whether a liveness probe or a 60 s API timeout
# fires. Seen on a loaded 2-core CI machine: API servers answering 504 and an operator's
# liveness probe restarting it in a loop while the CPU-bound sessions ran beside them.
# Alone, rest and runtime take 246 s together (313 CPU-s) and the cluster sessions 554-639 s
# (mostly waiting): at niceness 10 (was 5) the CPU-bound two fill the gaps the waiting sessions
# leave instead of stretching them (a process at 10 weighs 110 against 1024 at 0).
# CPU-seconds by session, where the machine has cgroup v1's cpuacct (this one and CI's do):
# each session runs in a cgroup of its own (its control plane, operators, kubelets, and pytest's
# children with it). Not counted: the containers of the real nodes, whose cgroups
# (/torchjob-<cluster>, hack/node.sh) go with the nodes at the session's end. The sessions'
# times say how long each took; these say what each cost the machine (tests/cpu_profile.py
# splits a session alone by test).
# Only where cpuacct is mounted alone: co-mounted with cpu (cpu,cpuacct), a cgroup per session
# would also share the CPU between the sessions as groups, and NICE below would rank nothing.
CPUACCT=/sys/fs/cgroup/cpuacct
awk -v d="${CPUACCT}" '$2 == d && $3 == "cgroup" && ("," $4 ",") !~ /,cpu,/ { ok = 1 } END { exit !ok }' \
  /proc/mounts || CPUACCT=/nonexistent
E2E_CLUSTER="${TORCHJOB_E2E_CLUSTER_NAME:-torchjob-e2e}"
PODS_CLUSTER="${TORCHJOB_PODS_CLUSTER_NAME:-torchjob-pods}"
session_ns() { cat "${CPUACCT}/torchjob-session-$1/cpuacct.usage" 2>/dev/null || echo 0; }

run() {
  local name="$1" t0=${SECONDS} rc profile=()
  shift
  if [[ -w "${CPUACCT}" ]] && mkdir -p "${CPUACCT}/torchjob-session-${name}" 2>/dev/null &&
    echo "${BASHPID}" >"${CPUACCT}/torchjob-session-${name}/cgroup.procs" 2>/dev/null; then
    # CPU-s per test and per file at the session's end (tests/cpu_profile.py): the session's
    # cgroup, and its real nodes' containers (hack/node.sh: /torchjob-<cluster>).
    TORCHJOB_CPU_PROFILE_CGROUPS="${CPUACCT}/torchjob-session-${name}"
    if [[ "${TORCHJOB_REAL_NODES:-0}" != 0 ]]; then
      TORCHJOB_CPU_PROFILE_CGROUPS+=":${CPUACCT}/torchjob-${TORCHJOB_CLUSTER_NAME:-torchjob}"
    fi
    export TORCHJOB_CPU_PROFILE_CGROUPS
    export TORCHJOB_CPU_PROFILE_TOP=15
    profile=(-p tests.cpu_profile)
  fi
  nice -n "${NICE:-0}" "${PY}" -m pytest --basetemp="${BASE}/${name}" -o cache_dir=".pytest_cache/${name}" \
    --timeout="${PER_TEST_TIMEOUT}" "${profile[@]}" "$@" 2>&1 \
    | tee "${BASE}/${name}.out" | sed -u "s/^/[${name}] /"
  rc="${PIPESTATUS[0]}"
  echo "$((SECONDS - t0))" >"${BASE}/${name}.time"
  return "${rc}"
}

E2E=(tests/cluster/test_real_node.py tests/cluster/test_node_faults.py tests/cluster/test_real_nodes.py
  tests/cluster/test_operator_scale.py)
RUNTIME=(tests/runtime/test_[s-z]*.py)
ignore_runtime=()
for f in "${RUNTIME[@]}"; do ignore_runtime+=("--ignore=${f}"); done
PODS=(tests/cluster/test_e2e_runtime.py tests/cluster/test_chaos.py tests/cluster/test_real_node_examples.py)
ignore_e2e=()
for f in "${E2E[@]}" "${PODS[@]}"; do ignore_e2e+=("--ignore=${f}"); done

# What the machine went through, for whoever reads a failed run afterwards: CPU (us, sy, id,
# wa, st) every 30 s, and the busiest processes with their niceness every 2 minutes; the test
# clusters' component logs are kept at teardown (hack/cluster.sh down).
export TORCHJOB_KEEP_LOGS_DIR="${BASE}/cluster-logs"
rm -rf "${TORCHJOB_KEEP_LOGS_DIR}"
stdbuf -oL vmstat -t 30 >"${BASE}/vmstat.log" 2>&1 &
vmstat_pid=$!
( while sleep 120; do
    date -u +%T
    ps -eo pid,ni,pcpu,rss,etimes,args --sort=-pcpu | head -n 16 | cut -c1-160
  done ) >"${BASE}/top.log" 2>&1 &
top_pid=$!
trap 'kill "${vmstat_pid}" "${top_pid}" 2>/dev/null' EXIT

for name in rest runtime cluster e2e pods; do session_ns "${name}" >"${BASE}/${name}.cpu0"; done
start=$(date +%s)
run cluster tests/cluster "${ignore_e2e[@]}" "$@" &
cluster_pid=$!
TORCHJOB_CLUSTER_NAME="${E2E_CLUSTER}" \
  TORCHJOB_REAL_NODES="${TORCHJOB_E2E_REAL_NODES:-3}" run e2e "${E2E[@]}" "$@" &
e2e_pid=$!
TORCHJOB_CLUSTER_NAME="${PODS_CLUSTER}" \
  TORCHJOB_REAL_NODES="${TORCHJOB_PODS_REAL_NODES:-1}" run pods "${PODS[@]}" "$@" &
pods_pid=$!
NICE=10 run runtime "${RUNTIME[@]}" "$@" &
runtime_pid=$!
rest_rc=0
(NICE=10 run rest tests --ignore=tests/cluster "${ignore_runtime[@]}" "$@") || rest_rc=$?
cluster_rc=0
wait "${cluster_pid}" || cluster_rc=$?
e2e_rc=0
wait "${e2e_pid}" || e2e_rc=$?
pods_rc=0
wait "${pods_pid}" || pods_rc=$?
runtime_rc=0
wait "${runtime_pid}" || runtime_rc=$?
# The five sessions' output interleaves, and a CI page often shows only the end of the log:
# what each wait that timed out saw (the section a session's output ends with:
# tests/failure_tail.py), then every failed or erroring test by name, last.
for name in rest runtime cluster e2e pods; do
  awk '/^=+ waits that timed out, again/ { on = 1 } on && /^=+ / && !/waits that timed out/ { on = 0 } on' \
    "${BASE}/${name}.out" 2>/dev/null | sed "s/^/[${name}] /"
done
for name in rest runtime cluster e2e pods; do
  grep -E "^(FAILED|ERROR) " "${BASE}/${name}.out" 2>/dev/null | sed "s/^/[${name}] /"
done
took() { echo "$(cat "${BASE}/$1.time" 2>/dev/null || echo '?')s"; }
# Each session's last line (pytest's count of passed, failed, skipped) and its time.
for name in rest runtime cluster e2e pods; do
  echo "[${name}] $(tail -n 1 "${BASE}/${name}.out" 2>/dev/null) ($(took "${name}"))"
done
if [[ -w "${CPUACCT}" ]]; then
  for name in rest runtime cluster e2e pods; do
    awk -v n="${name}" -v s0="$(cat "${BASE}/${name}.cpu0")" -v s1="$(session_ns "${name}")" \
      -v t="$(took "${name}")" \
      'BEGIN { printf "[%s] %.0f CPU-s in %s (not counted: containers on real nodes)\n", n, (s1 - s0) / 1e9, t }'
  done
fi
echo "make test: rest (unit, gpu, runtime a-r) exit ${rest_rc}; runtime (s-z) exit ${runtime_rc};" \
  "cluster exit ${cluster_rc}; e2e exit ${e2e_rc}; pods exit ${pods_rc}; $(($(date +%s) - start))s"
# pytest's 5 (nothing collected) is a failure too.
[[ "${rest_rc}" == 0 && "${runtime_rc}" == 0 && "${cluster_rc}" == 0 && "${e2e_rc}" == 0 \
  && "${pods_rc}" == 0 ]]
