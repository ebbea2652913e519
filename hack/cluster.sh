#!/usr/bin/env bash
# The local test cluster: real etcd, kube-apiserver, kube-controller-manager and kube-scheduler
# started as processes by kwokctl's binary runtime, with kwok playing the kubelets of fake nodes
# (4 GPU nodes, 2 CPU nodes). Binaries come from hack/build-testbin.sh (run `make testbin`).
#
#   hack/cluster.sh up          start (or reuse) the cluster; prints the kubeconfig path on stdout
#   hack/cluster.sh down        delete the cluster and its workdir
#   hack/cluster.sh kubeconfig  print the kubeconfig path
#   hack/cluster.sh status      exit 0 when the cluster answers, print its nodes
#   hack/cluster.sh revive      start again any control-plane component that exited
#
# Never touches ~/.kube: use `export KUBECONFIG=$(hack/cluster.sh kubeconfig)`.
# Environment:
#   TORCHJOB_TESTBIN_ROOT   binaries and cluster workdir (default ~/.cache/torchjob/testbin)
#   TORCHJOB_CLUSTER_NAME   cluster name (default torchjob)
#   TORCHJOB_GPU_NODES / TORCHJOB_CPU_NODES   node counts (default 4 / 2)
#   TORCHJOB_GPUS_PER_NODE  nvidia.com/gpu per GPU node (default 8)
#   TORCHJOB_CLUSTER_WAIT_S how long each step of `up` may take (default 180)
#   TORCHJOB_CONTROL_PLANE_NICE  niceness of the control-plane processes (default -10)
#   TORCHJOB_KEEP_LOGS_DIR  `down` copies the components' logs to <dir>/<name> first
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

ROOT="${TORCHJOB_TESTBIN_ROOT:-${HOME}/.cache/torchjob/testbin}"
NAME="${TORCHJOB_CLUSTER_NAME:-torchjob}"
GPU_NODES="${TORCHJOB_GPU_NODES:-4}"
CPU_NODES="${TORCHJOB_CPU_NODES:-2}"
GPUS_PER_NODE="${TORCHJOB_GPUS_PER_NODE:-8}"

KUBE_DIR="${ROOT}/kubernetes-${KUBE_VERSION}"
ETCD_DIR="${ROOT}/etcd-${ETCD_VERSION}"
KWOK_DIR="${ROOT}/kwok-${KWOK_VERSION}"
# kwokctl keeps every cluster under $KWOK_WORKDIR/clusters/<name>; keep it in the cache, keyed
# by the versions so a bump never reuses a cluster of the old binaries.
export KWOK_WORKDIR="${ROOT}/kwok-workdir/k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
CLUSTER_DIR="${KWOK_WORKDIR}/clusters/${NAME}"
KUBECONFIG_PATH="${CLUSTER_DIR}/kubeconfig.yaml"

KWOKCTL="${KWOK_DIR}/kwokctl"
# kwok plays the kubelet only of nodes carrying this annotation, so tests may register nodes
# of their own (a helper playing kubelet with real processes) that kwok leaves alone.
KWOK_NODE_ANNOTATION="kwok.x-k8s.io/node=fake"
KUBECTL="${KUBE_DIR}/kubectl"

log() { printf '[cluster] %s\n' "$*" >&2; }
die() { printf '[cluster] error: %s\n' "$*" >&2; exit 1; }

now_ms() { date +%s%3N; }

require_binaries() {
  local b missing=()
  for b in "${KUBE_DIR}/kube-apiserver" "${KUBE_DIR}/kube-controller-manager" \
    "${KUBE_DIR}/kube-scheduler" "${KUBECTL}" "${ETCD_DIR}/etcd" "${KWOK_DIR}/kwok" "${KWOKCTL}"; do
    [[ -x "${b}" ]] || missing+=("${b}")
  done
  if [[ ${#missing[@]} -gt 0 ]]; then
    die "missing control-plane binaries (run 'make testbin'): ${missing[*]}"
  fi
}

kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

healthy() {
  [[ -f "${KUBECONFIG_PATH}" ]] || return 1
  kc get --raw /readyz --request-timeout=3s >/dev/null 2>&1
}

# The control plane runs at niceness TORCHJOB_CONTROL_PLANE_NICE (default -10; the processes
# kwokctl starts inherit it): a test cluster shares its machine with CPU-bound torch workers
# (make test runs five sessions on 2 cores), and an API server or etcd that waits its turn
# behind them misses client-go's 10 s TLS handshake, answers 504 or lets a lease expire, which
# tests then see as failures of the operator. A few ms of CPU served first is all they need.
# Not root: a niceness below 0 is not allowed, so they keep the caller's.
CONTROL_PLANE_NICE="${TORCHJOB_CONTROL_PLANE_NICE:--10}"
if [[ "$(id -u)" != 0 && "${CONTROL_PLANE_NICE}" -lt 0 ]]; then CONTROL_PLANE_NICE=0; fi

kwokctl() {
  # 8>&- 9>&-: the control-plane processes kwokctl starts must not inherit (and hold) the locks.
  nice -n "${CONTROL_PLANE_NICE}" "${KWOKCTL}" --name "${NAME}" "$@" 8>&- 9>&-
}

# kwokctl (v0.8.0) picks a cluster's ports by counting down from 32767 and taking the first
# one nobody listens on *yet*: two clusters created at the same moment (make test creates three
# at once) get the same ports, and the second one's etcd or kube-apiserver cannot bind. Creating
# clusters one at a time, each until its components listen, makes that impossible.
create_lock() {
  if command -v flock >/dev/null 2>&1; then
    exec 9>"${KWOK_WORKDIR}/.create-lock"
    flock -w 300 9 || die "could not lock ${KWOK_WORKDIR}/.create-lock within 300s"
  fi
}
create_unlock() { exec 9>&-; }

# The end of each component's log, for an error message that says why a create failed.
component_logs() {
  local f
  for f in "${CLUSTER_DIR}"/logs/*.log; do
    [[ -f "${f}" ]] || continue
    printf '[cluster] --- %s (last lines)\n' "${f##*/}" >&2
    tail -n 5 "${f}" >&2
  done
}

# How long each step of `up` may take. A component that starts in seconds on an idle machine
# took over 60 s on a CI machine running the five test sessions at once (three clusters start
# beside multi-process torch tests on 2 cores), so the default is generous; a healthy cluster
# never waits it out.
# CI's TORCHJOB_TEST_TIME_SCALE (3) stretches it as it stretches the tests' waits.
WAIT_S="${TORCHJOB_CLUSTER_WAIT_S:-$(awk -v s="${TORCHJOB_TEST_TIME_SCALE:-1}" 'BEGIN { printf "%d", 180 * (s < 1 ? 1 : s) }')}"

# try_until <seconds> <command...>: 0 once the command succeeds, 1 when the time is up.
try_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    # A component that exited meanwhile (kwok-controller and kube-controller-manager give up
    # on a slow API server after seconds) is started again: see revive_components.
    [[ -d "${CLUSTER_DIR}/pids" ]] && revive_components
    sleep 0.5
  done
}

# wait_until <seconds> <description> <command...>: fails `up`, with the components' last log
# lines (a crashed kube-controller-manager says why there), when the time is up.
wait_until() {
  local timeout="$1" what="$2"
  shift 2
  if ! try_until "${timeout}" "$@"; then
    component_logs
    die "timed out after ${timeout}s waiting for ${what}; logs: ${CLUSTER_DIR}/logs"
  fi
}

nodes_manifest() {
  local i
  for ((i = 0; i < GPU_NODES; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: gpu-node-${i}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: gpu-node-${i}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: Fake-GPU-80GB
    nvidia.com/gpu.count: "${GPUS_PER_NODE}"
    topology.kubernetes.io/zone: zone-$((i % 2))
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "${GPUS_PER_NODE}", ephemeral-storage: 1Ti}
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "${GPUS_PER_NODE}", ephemeral-storage: 1Ti}
EOF
  done
  for ((i = 0; i < CPU_NODES; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: cpu-node-${i}
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: cpu-node-${i}
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    topology.kubernetes.io/zone: zone-$((i % 2))
status:
  allocatable: {cpu: "32", memory: 128Gi, pods: "110", ephemeral-storage: 1Ti}
  capacity: {cpu: "32", memory: 128Gi, pods: "110", ephemeral-storage: 1Ti}
EOF
  done
}

# Names of the Ready nodes, one a line (fails when the apiserver does not answer).
ready_nodes() {
  kc get nodes --request-timeout=3s \
    -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
    awk '$2 == "True" {print $1}'
}

expected_nodes() {
  local i
  for ((i = 0; i < GPU_NODES; i++)); do echo "gpu-node-${i}"; done
  for ((i = 0; i < CPU_NODES; i++)); do echo "cpu-node-${i}"; done
}

all_nodes_ready() {
  local ready
  ready="$(ready_nodes)" || return 1
  [[ -z "$(comm -23 <(expected_nodes | sort) <(sort <<<"${ready}"))" ]]
}

default_sa_exists() { kc -n default get serviceaccount default; }

# kwokctl's binary runtime starts the components and never restarts them, where a real control
# plane's kubelet or systemd would. A kube-controller-manager gives the API server about 10 s to
# report healthy and exits when it is not (its RBAC bootstrap took longer on a loaded machine):
# a cluster without it creates no ServiceAccount, ReplicaSet or garbage collection, and every
# later test waits on what never comes. `kwokctl start cluster` starts only the stopped ones.
dead_components() {
  local pidfile pid
  for pidfile in "${CLUSTER_DIR}"/pids/*.pid; do
    [[ -f "${pidfile}" ]] || continue
    pid="$(<"${pidfile}")"
    kill -0 "${pid}" 2>/dev/null || basename "${pidfile}" .pid
  done
}

revive_components() {
  local dead name
  dead="$(dead_components)"
  [[ -n "${dead}" ]] || return 0
  for name in ${dead}; do
    log "${name} of cluster '${NAME}' exited; starting it again. Its last log lines:"
    tail -n 3 "${CLUSTER_DIR}/logs/${name}.log" >&2 2>/dev/null || true
  done
  kwokctl start cluster >/dev/null 2>&1 || log "kwokctl start cluster failed"
}

ensure_nodes() {
  nodes_manifest | kc apply -f - >/dev/null
  wait_until "${WAIT_S}" "nodes to become Ready" all_nodes_ready
}

# The cluster's config (stages, flags) is fixed at creation: remember what it was made from.
# Bump CLUSTER_CONFIG_REVISION when the kwokctl flags or node shapes below change.
CLUSTER_CONFIG_REVISION=5
config_digest() {
  # The kwok build too (its .stamp): kwokctl copied its binary into the cluster when it made it.
  { cat "${HACK_DIR}/kwok/stages.yaml" "${HACK_DIR}/kwok/logs.yaml" "${KWOK_DIR}/.stamp" 2>/dev/null; echo "rev=${CLUSTER_CONFIG_REVISION} gpu=${GPU_NODES}x${GPUS_PER_NODE} cpu=${CPU_NODES}"; } |
    sha256sum | cut -d' ' -f1
}
DIGEST_FILE="${CLUSTER_DIR}/torchjob-config.sha256"

# hack/kwok/logs.yaml with its @HACK_KWOK_DIR@ made absolute (kwokctl resolves a relative
# logsFile against its own working directory); prints the path of the copy.
logs_config() {
  local out="${KWOK_WORKDIR}/${NAME}-logs.yaml"
  sed "s|@HACK_KWOK_DIR@|${HACK_DIR}/kwok|g" "${HACK_DIR}/kwok/logs.yaml" >"${out}"
  echo "${out}"
}

# Extra kwokctl options for a real node (hack/node.sh): the API server's certificate must also
# name the addresses pods and the node reach it at (the host end of the node's veth, and the
# `kubernetes` Service's ClusterIP 10.0.0.1, the default service range's first address).
node_config() {
  local out="${KWOK_WORKDIR}/${NAME}-node.yaml"
  cat >"${out}" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  kubeApiserverCertSANs: ["10.0.0.1", "$("${HACK_DIR}/node.sh" cert-sans)"]
EOF
  echo "${out}"
}

cmd_up() {
  require_binaries
  local start
  start=$(now_ms)
  if [[ -d "${CLUSTER_DIR}" && "$(cat "${DIGEST_FILE}" 2>/dev/null)" != "$(config_digest)" ]]; then
    log "hack/kwok/stages.yaml, logs.yaml, the kwok build or the cluster config changed since cluster '${NAME}' was created: recreating it"
    cmd_down
  fi
  if [[ -f "${KUBECONFIG_PATH}" ]] && all_nodes_ready 2>/dev/null; then
    # The fast path: one API call shows a running cluster with all its nodes Ready (and
    # whatever component exited since is started again).
    revive_components
    log "cluster '${NAME}' is already running (ready in $((($(now_ms) - start)))ms)"
    echo "${KUBECONFIG_PATH}"
    return
  fi
  if healthy; then
    log "cluster '${NAME}' is running; (re)applying its nodes"
  else
    # A restart binds the ports chosen at creation, so it is serialized with creations too.
    create_lock
    # A cluster whose processes are gone (a reboot, a killed session) is started again; one
    # that does not come back in time is made anew rather than failing the run.
    if [[ -f "${CLUSTER_DIR}/kwok.yaml" ]] && kwokctl start cluster >/dev/null 2>&1 &&
      try_until "${WAIT_S}" healthy; then
      log "cluster '${NAME}' restarted"
    else
      [[ -d "${CLUSTER_DIR}" ]] && { log "removing a broken cluster '${NAME}'"; component_logs; cmd_down; }
      if ! create_cluster; then
        # One more try from nothing: a port that something else took between kwokctl's check
        # and its component's bind is the likely cause, and the next try picks other ports.
        log "kwokctl create cluster failed; its log and the components' logs:"
        cat "${KWOK_WORKDIR}/${NAME}-create.log" >&2
        component_logs
        log "deleting cluster '${NAME}' and creating it again"
        cmd_down
        if ! create_cluster; then
          cat "${KWOK_WORKDIR}/${NAME}-create.log" >&2
          component_logs
          die "kwokctl create cluster '${NAME}' failed twice (its output and the components' logs are above)"
        fi
      fi
      config_digest >"${DIGEST_FILE}"
      wait_until "${WAIT_S}" "kube-apiserver" healthy
    fi
    create_unlock
  fi
  ensure_nodes
  wait_until "${WAIT_S}" "the default ServiceAccount (kube-controller-manager)" default_sa_exists
  log "ready in $((($(now_ms) - start)))ms; export KUBECONFIG=${KUBECONFIG_PATH}"
  echo "${KUBECONFIG_PATH}"
}

# etcd runs with --unsafe-no-fsync: a test cluster's data need not survive a power cut, and on
# a machine whose disk is busy (containerd unpacking images for three real nodes, checkpoint
# tests) an fsync that takes seconds made the API server answer 504 after its 60 s timeout.
# One kube-controller-manager and one kube-scheduler: no leader election. With it, a busy
# machine that delays a lease renewal past its deadline makes either exit ("leaderelection
# lost"), and nothing restarts it: every later test then waits on a namespace's default
# ServiceAccount, a garbage collection or a binding that never comes (seen under load).
create_cluster() {
  mkdir -p "${KWOK_WORKDIR}"
  log "creating cluster '${NAME}' (Kubernetes ${KUBE_VERSION}, etcd ${ETCD_VERSION}, kwok ${KWOK_VERSION})"
  # --kubeconfig "" keeps kwokctl away from ~/.kube/config.
  KWOK_KUBECTL_BINARY="${KUBECTL}" kwokctl create cluster \
    --runtime binary \
    --kubeconfig "" \
    --kube-apiserver-binary "${KUBE_DIR}/kube-apiserver" \
    --kube-controller-manager-binary "${KUBE_DIR}/kube-controller-manager" \
    --kube-scheduler-binary "${KUBE_DIR}/kube-scheduler" \
    --etcd-binary "${ETCD_DIR}/etcd" \
    --kwok-controller-binary "${KWOK_DIR}/kwok" \
    --kube-authorization=true \
    --kube-admission=true \
    --disable-qps-limits \
    --heartbeat-factor 1 \
    --extra-args kwok-controller=manage-all-nodes=false \
    --extra-args kube-controller-manager=leader-elect=false \
    --extra-args kube-scheduler=leader-elect=false \
    --extra-args etcd=unsafe-no-fsync=true \
    --extra-args kube-apiserver=kubelet-preferred-address-types=InternalIP,Hostname \
    --extra-args "kwok-controller=manage-nodes-with-annotation-selector=${KWOK_NODE_ANNOTATION}" \
    --config "${HACK_DIR}/kwok/stages.yaml" \
    --config "$(logs_config)" \
    --config "$(node_config)" \
    --timeout 5m \
    --wait 2m >"${KWOK_WORKDIR}/${NAME}-create.log" 2>&1
}

cmd_down() {
  # TORCHJOB_KEEP_LOGS_DIR (hack/test.sh sets it): the components' logs outlive the cluster,
  # for whoever reads why a run failed after it ended.
  if [[ -n "${TORCHJOB_KEEP_LOGS_DIR:-}" && -d "${CLUSTER_DIR}/logs" ]]; then
    mkdir -p "${TORCHJOB_KEEP_LOGS_DIR}/${NAME}" &&
      cp -r "${CLUSTER_DIR}/logs/." "${TORCHJOB_KEEP_LOGS_DIR}/${NAME}/" 2>/dev/null ||
      log "could not keep the logs in ${TORCHJOB_KEEP_LOGS_DIR}"
  fi
  # A real node (hack/node.sh) first: its processes and veth go with the cluster.
  if [[ -d "${CLUSTER_DIR}/realnode" ]]; then
    "${HACK_DIR}/node.sh" down || log "hack/node.sh down failed"
  fi
  if [[ -x "${KWOKCTL}" && -d "${CLUSTER_DIR}" ]]; then
    # kwokctl delete rejects --kubeconfig "" (v0.8.0: "empty path"); point it at a file of
    # its own so that it never edits ~/.kube/config.
    kwokctl delete cluster --kubeconfig "${KWOK_WORKDIR}/unused-user-kubeconfig.yaml" >/dev/null 2>&1 ||
      log "kwokctl delete cluster failed; stopping its processes and removing ${CLUSTER_DIR}"
  fi
  # Whatever kwokctl left running (it records every process it starts in pids/).
  local pidfile pid
  for pidfile in "${CLUSTER_DIR}"/pids/*.pid; do
    [[ -f "${pidfile}" ]] || continue
    pid="$(<"${pidfile}")"
    if [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null &&
      [[ "$(readlink "/proc/${pid}/cwd" 2>/dev/null)" == "${CLUSTER_DIR}" ]]; then
      kill "${pid}" 2>/dev/null || true
    fi
  done
  rm -rf "${CLUSTER_DIR}"
  log "cluster '${NAME}' deleted"
}

cmd_status() {
  if healthy; then
    log "cluster '${NAME}' is running; KUBECONFIG=${KUBECONFIG_PATH}"
    kc get nodes -L nvidia.com/gpu.present
  else
    log "cluster '${NAME}' is not running"
    return 1
  fi
}

# up and down of one cluster are serialized: parallel pytest sessions share it.
lock() {
  mkdir -p "${KWOK_WORKDIR}"
  if command -v flock >/dev/null 2>&1; then
    exec 8>"${KWOK_WORKDIR}/.${NAME}.cluster-lock"
    flock -w 300 8 || die "could not lock ${KWOK_WORKDIR}/.${NAME}.cluster-lock within 300s"
  fi
}

case "${1:-}" in
  up) lock && cmd_up ;;
  down) lock && cmd_down ;;
  kubeconfig) echo "${KUBECONFIG_PATH}" ;;
  status) cmd_status ;;
  revive) revive_components ;;
  *)
    echo "usage: $0 up|down|kubeconfig|status|revive" >&2
    exit 2
    ;;
esac
