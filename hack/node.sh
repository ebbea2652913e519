#!/usr/bin/env bash
# A real node for the local test cluster: kubelet + containerd + runc + CNI (bridge, host-local)
# + CoreDNS, joined to the kwokctl control plane of hack/cluster.sh beside its fake kwok nodes.
#
#   hack/node.sh up           start (or reuse) the real node of cluster $TORCHJOB_CLUSTER_NAME
#   hack/node.sh down         stop it and remove its state (also done by `hack/cluster.sh down`)
#   hack/node.sh import TAR.. import docker-archive image tars into the node's containerd
#   hack/node.sh status       exit 0 when the node runs
#   hack/node.sh name         print the Node's name
#   hack/node.sh host-ip      print the host's address on the node's veth: pods reach the
#                             machine there (the API server; tests/s3.py's object store)
#   hack/node.sh prereqs      exit 0 when every prerequisite is installed, else say what is missing
#
# Isolation (several clusters share one machine, and the machine itself is never changed):
# - the node lives in its own network namespace and a private mount namespace (unshare); the
#   only change to the machine's network is one veth pair, tjh<IDX> on the host side with
#   10.213.IDX.1/30 (IDX from the cluster name, or $TORCHJOB_NODE_NET_INDEX). Pods get
#   10.214.IDX.0/24 on a bridge inside the node's namespace, which has no default route: pods
#   reach the node, each other and the API server, nothing off the machine;
# - no kube-proxy: it would rewrite iptables chains that every cluster shares. Inside the node's
#   own namespace one DNAT rule sends the `kubernetes` Service (ClusterIP:443) to the API
#   server, which is what in-cluster clients (the operator, rank 0's status reports) use;
#   headless Services (the workers') need no proxy. Other ClusterIP Services do not work here;
# - CoreDNS listens on the node's address inside its namespace (port 53 there collides with
#   nothing); kubelet's port 10250 is in that namespace too;
# - kubelet writes to fixed paths (/var/lib/kubelet, /var/log/pods, ...): they are bind mounts
#   of this cluster's state directory inside the private mount namespace; the few /proc/sys
#   files kubelet wants to set are bind-mounted regular files holding the values it expects,
#   so the machine's sysctls stay as they are;
# - pods' cgroups live under /torchjob-<cluster> in every cgroup v1 hierarchy (kubelet
#   failCgroupV1: false; containerd restrict_oom_score_adj: no CAP_SYS_RESOURCE here).
# Binaries: kubelet and CoreDNS from `make testbin` (hack/build-testbin.sh, pinned in
# hack/versions.env); containerd, runc and the CNI plugins from Debian (apt-get install
# containerd runc containernetworking-plugins iptables iproute2).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

ROOT="${TORCHJOB_TESTBIN_ROOT:-${HOME}/.cache/torchjob/testbin}"
NAME="${TORCHJOB_CLUSTER_NAME:-torchjob}"
KUBE_DIR="${ROOT}/kubernetes-${KUBE_VERSION}"
KUBECTL="${KUBE_DIR}/kubectl"
KUBELET="${ROOT}/kubelet-${KUBE_VERSION}/kubelet"
COREDNS="${ROOT}/coredns-${COREDNS_VERSION}/coredns"
CNI_BIN_DIR="${TORCHJOB_CNI_BIN_DIR:-/usr/lib/cni}"
KUBECONFIG_PATH="$("${HACK_DIR}/cluster.sh" kubeconfig)"
CLUSTER_DIR="$(dirname "${KUBECONFIG_PATH}")"
STATE="${CLUSTER_DIR}/realnode"
NODE="${NAME}-real-0"
NODE_LABEL="torchjob.io/real-node"
# containerd's socket, at its usual path inside the node's mount namespace, where /run/containerd
# is a bind mount of this node's state (a socket path under the state directory would be too
# long for a unix socket); from outside: nsenter --target "$(cat ${STATE}/node.pid)" --mount.
SOCK=/run/containerd/containerd.sock

net_index() {
  if [[ -n "${TORCHJOB_NODE_NET_INDEX:-}" ]]; then
    echo "${TORCHJOB_NODE_NET_INDEX}"
  else
    echo $(($(printf '%s' "${NAME}" | cksum | cut -d' ' -f1) % 200 + 20))
  fi
}
IDX="$(net_index)"
HOST_IF="tjh${IDX}"
NODE_IF="tjn0"
HOST_IP="10.213.${IDX}.1"
NODE_IP="10.213.${IDX}.2"
POD_CIDR="10.214.${IDX}.0/24"
CGROUP_ROOT="/torchjob-${NAME}"

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] error: %s\n' "$*" >&2; exit 1; }
kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }
now_ms() { date +%s%3N; }

# What cluster.sh needs at creation for a real node to work: extra API server cert SANs.
if [[ "${1:-}" == "cert-sans" ]]; then
  echo "${HOST_IP}"
  exit 0
fi

missing_prereqs() {
  local m=() b
  [[ "$(id -u)" == 0 ]] || m+=("root (kubelet and containerd need it)")
  for b in containerd containerd-shim-runc-v2 runc ctr iptables ip unshare nsenter; do
    command -v "${b}" >/dev/null 2>&1 || m+=("${b}")
  done
  for b in bridge host-local loopback; do
    [[ -x "${CNI_BIN_DIR}/${b}" ]] || m+=("${CNI_BIN_DIR}/${b}")
  done
  [[ -x "${KUBELET}" ]] || m+=("${KUBELET} (make testbin)")
  [[ -x "${COREDNS}" ]] || m+=("${COREDNS} (make testbin)")
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || m+=("cgroups")
  printf '%s\n' "${m[@]}"
}

cgroup_dirs() { # the hierarchies where pods' cgroups go (v1: one per mounted controller)
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    echo /sys/fs/cgroup
  else
    awk '$3 == "cgroup" {print $2}' /proc/mounts
  fi
}

pid_of() { # the node's namespace holder (the inner script), when it runs
  local pid
  pid="$(cat "${STATE}/node.pid" 2>/dev/null)" || return 1
  [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null &&
    grep -q "node-inside" "/proc/${pid}/cmdline" 2>/dev/null && echo "${pid}"
}

node_ready() {
  [[ "$(kc get node "${NODE}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

diagnose() {
  {
    echo "--- kubectl describe node ${NODE}"
    kc describe node "${NODE}" 2>&1 | tail -40 || true
    local f
    for f in kubelet containerd coredns inside; do
      echo "--- ${STATE}/${f}.log (tail)"
      tail -25 "${STATE}/${f}.log" 2>/dev/null || true
    done
  } >&2
}

wait_until() { # wait_until <seconds> <what> <cmd...>
  local timeout="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      diagnose
      die "timed out after ${timeout}s waiting for ${what} (state: ${STATE})"
    fi
    if [[ -f "${STATE}/node.pid" ]] && ! pid_of >/dev/null; then
      diagnose
      die "the node's processes exited while waiting for ${what} (state: ${STATE})"
    fi
    sleep 0.5
  done
}

write_configs() {
  local server
  server="$(sed -n 's/^[[:space:]]*server: //p' "${KUBECONFIG_PATH}" | head -1)"
  API_PORT="${server##*:}"
  mkdir -p "${STATE}"/{containerd,cni/net.d,cni/ipam,kubelet,sysctl,mnt}
  # The admin credentials of the kwokctl cluster, with the API server at the host end of the veth.
  sed "s#^\([[:space:]]*server:\).*#\1 https://${HOST_IP}:${API_PORT}#" "${KUBECONFIG_PATH}" >"${STATE}/kubeconfig.yaml"
  cat >"${STATE}/containerd/config.toml" <<EOF
version = 2
root = "${STATE}/containerd/root"
state = "${STATE}/containerd/state"
[grpc]
  address = "${SOCK}"
[ttrpc]
  address = "${SOCK}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "${STATE}/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN_DIR}"
    conf_dir = "${STATE}/cni/net.d"
EOF
  cat >"${STATE}/cni/net.d/10-torchjob.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "torchjob-${NAME}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "tjbr0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "${POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "${STATE}/cni/ipam"
      }
    }
  ]
}
EOF
  cat >"${STATE}/Corefile" <<EOF
.:53 {
    bind ${NODE_IP}
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig ${STATE}/kubeconfig.yaml
        pods insecure
        ttl 5
        fallthrough in-addr.arpa ip6.arpa
    }
}
EOF
  # Pods resolve cluster names only: no upstream nameserver (pods have no way off the machine).
  printf 'options ndots:5\n' >"${STATE}/resolv.conf"
  cat >"${STATE}/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: ${CGROUP_ROOT}
address: ${NODE_IP}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [${NODE_IP}]
resolvConf: ${STATE}/resolv.conf
containerRuntimeEndpoint: unix://${SOCK}
podCIDR: ${POD_CIDR}
failSwapOn: false
protectKernelDefaults: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
registerWithTaints:
  - {key: ${NODE_LABEL}, value: "true", effect: NoSchedule}
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
shutdownGracePeriod: 0s
maxPods: 50
EOF
}

# The kubelet's expectations of /proc/sys (pkg/kubelet/cm: setupKernelTunables).
SYSCTLS=(vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1
  kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000)

# The inner script: runs in the node's private mount + network namespaces; its pid holds them.
write_inside() {
  cat >"${STATE}/node-inside.sh" <<'EOF'
#!/usr/bin/env bash
# Generated by hack/node.sh: the node's namespaces' first process. Do not run by hand.
set -euo pipefail
STATE="$1"; KUBELET="$2"; COREDNS="$3"; NODE="$4"; NODE_IP="$5"; HOST_IP="$6"; POD_CIDR="$7"
NODE_IF="$8"; SVC_IP="$9"; API_PORT="${10}"; NODE_LABEL="${11}"; shift 11
SYSCTLS=("$@")
exec >>"${STATE}/inside.log" 2>&1
echo "[$(date -u +%T)] node namespaces up (pid $$)"
# Fixed paths kubelet, containerd and CNI write to: bind mounts of this node's state.
for d in /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /run/netns \
  /run/containerd /var/lib/containerd; do
  real="$(readlink -f "${d}")"
  mkdir -p "${real}" "${STATE}/mnt${real}"
  mount --bind "${STATE}/mnt${real}" "${real}"
done
mount --make-rshared /var/lib/kubelet
for kv in "${SYSCTLS[@]}"; do
  key="${kv%%=*}"; want="${kv#*=}"
  [[ -f "/proc/sys/${key}" ]] || continue
  if [[ "$(cat "/proc/sys/${key}")" != "${want}" ]]; then
    f="${STATE}/sysctl/${key//\//.}"
    echo "${want}" >"${f}"
    mount --bind "${f}" "/proc/sys/${key}"
  fi
done
# Wait for hack/node.sh to move our end of the veth in.
for _ in $(seq 300); do ip link show "${NODE_IF}" >/dev/null 2>&1 && break; sleep 0.1; done
ip link set lo up
ip addr add "${NODE_IP}/30" dev "${NODE_IF}"
ip link set "${NODE_IF}" up
# This namespace's own forwarding (pods <-> node); no default route, so nothing leaves.
echo 1 >/proc/sys/net/ipv4/ip_forward
# The `kubernetes` Service -> the API server at the host end of the veth.
iptables -t nat -A PREROUTING -d "${SVC_IP}/32" -p tcp --dport 443 -j DNAT --to-destination "${HOST_IP}:${API_PORT}"
iptables -t nat -A OUTPUT -d "${SVC_IP}/32" -p tcp --dport 443 -j DNAT --to-destination "${HOST_IP}:${API_PORT}"
iptables -t nat -A POSTROUTING -s "${POD_CIDR}" -o "${NODE_IF}" -j MASQUERADE
pids=()
cleanup() {
  trap - TERM INT EXIT
  echo "[$(date -u +%T)] stopping"
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
}
trap cleanup TERM INT EXIT
containerd --config "${STATE}/containerd/config.toml" >>"${STATE}/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 300); do [[ -S /run/containerd/containerd.sock ]] && break; sleep 0.1; done
"${COREDNS}" -conf "${STATE}/Corefile" >>"${STATE}/coredns.log" 2>&1 &
pids+=($!)
"${KUBELET}" --config "${STATE}/kubelet/config.yaml" --kubeconfig "${STATE}/kubeconfig.yaml" \
  --hostname-override "${NODE}" --node-ip "${NODE_IP}" \
  --node-labels "${NODE_LABEL}=true,kubernetes.io/os=linux" \
  --v 1 >>"${STATE}/kubelet.log" 2>&1 &
pids+=($!)
echo "[$(date -u +%T)] started containerd, coredns, kubelet: ${pids[*]}"
# Stop everything when any of them dies: hack/node.sh notices and reports.
wait -n "${pids[@]}" || true
echo "[$(date -u +%T)] a node process exited"
EOF
  chmod +x "${STATE}/node-inside.sh"
}

cmd_up() {
  local start
  start=$(now_ms)
  local missing
  missing="$(missing_prereqs)"
  [[ -z "${missing}" ]] || die "missing prerequisites: $(tr '\n' ' ' <<<"${missing}")(Debian: apt-get install containerd runc containernetworking-plugins iptables iproute2; then make testbin)"
  kc get --raw /readyz >/dev/null 2>&1 || die "cluster '${NAME}' is not running (hack/cluster.sh up)"
  if pid_of >/dev/null && node_ready; then
    log "node ${NODE} is already running (checked in $(($(now_ms) - start))ms)"
    return
  fi
  cmd_down quiet
  if ip -4 route show | grep -qE "^10\.21[34]\.${IDX}\."; then
    die "10.213.${IDX}.0/30 or 10.214.${IDX}.0/24 is already routed on this machine; set TORCHJOB_NODE_NET_INDEX to a free 0-255"
  fi
  PAUSE_IMAGE="$("${HACK_DIR}/images.sh" ref pause)"
  write_configs
  write_inside
  local cg
  for cg in $(cgroup_dirs); do
    mkdir -p "${cg}${CGROUP_ROOT}"
    if [[ -f "${cg}/cpuset.cpus" ]]; then
      cat "${cg}/cpuset.cpus" >"${cg}${CGROUP_ROOT}/cpuset.cpus"
      cat "${cg}/cpuset.mems" >"${cg}${CGROUP_ROOT}/cpuset.mems"
    fi
    # The weight kubelet gives kubepods at the machine's root (1024 per CPU): without it all
    # of the node's containers together weigh as much as one process outside it.
    if [[ -f "${cg}${CGROUP_ROOT}/cpu.shares" ]]; then
      echo $(($(nproc) * 1024)) >"${cg}${CGROUP_ROOT}/cpu.shares"
    fi
  done
  local svc_ip
  svc_ip="$(kc get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')"
  local kv sysctls=()
  for kv in "${SYSCTLS[@]}"; do sysctls+=("${kv}"); done
  setsid unshare --mount --net --propagation private \
    "${STATE}/node-inside.sh" "${STATE}" "${KUBELET}" "${COREDNS}" "${NODE}" "${NODE_IP}" \
    "${HOST_IP}" "${POD_CIDR}" "${NODE_IF}" "${svc_ip}" "${API_PORT}" "${NODE_LABEL}" \
    "${sysctls[@]}" </dev/null >>"${STATE}/inside.log" 2>&1 7>&- &
  local pid=$!
  echo "${pid}" >"${STATE}/node.pid"
  # Our end of the veth pair on the host, the other end into the node's namespace.
  local i
  for i in $(seq 50); do [[ "$(readlink "/proc/${pid}/ns/net")" != "$(readlink /proc/self/ns/net)" ]] && break; sleep 0.1; done
  readlink "/proc/${pid}/ns/mnt" >"${STATE}/node.mntns"
  ip link add "${HOST_IF}" type veth peer name "${NODE_IF}" netns "${pid}"
  ip addr add "${HOST_IP}/30" dev "${HOST_IF}"
  ip link set "${HOST_IF}" up
  wait_until 120 "node ${NODE} to register" kc get node "${NODE}"
  wait_until 120 "node ${NODE} to become Ready" node_ready
  log "node ${NODE} Ready in $(($(now_ms) - start))ms (pods ${POD_CIDR}, DNS ${NODE_IP}, state ${STATE})"
}

cmd_import() {
  local pid
  pid="$(pid_of)" || die "node ${NODE} is not running (hack/node.sh up)"
  local tar start
  for tar in "$@"; do
    start=$(now_ms)
    nsenter --target "${pid}" --mount ctr --address "${SOCK}" -n k8s.io images import --no-unpack "${tar}" >/dev/null ||
      die "ctr images import ${tar} failed"
    log "imported ${tar##*/} in $(($(now_ms) - start))ms"
  done
}

cmd_down() {
  local quiet="${1:-}" pid mntns
  mntns="$(cat "${STATE}/node.mntns" 2>/dev/null || true)"
  if pid="$(pid_of)"; then
    kill "${pid}" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  fi
  # Whatever still runs in this node's cgroups (containers; their shims are in the state dir).
  local cg p
  for _ in 1 2 3; do
    for cg in $(cgroup_dirs); do
      [[ -d "${cg}${CGROUP_ROOT}" ]] || continue
      for p in $(find "${cg}${CGROUP_ROOT}" -name cgroup.procs -exec cat {} + 2>/dev/null); do
        kill -9 "${p}" 2>/dev/null || true
      done
    done
    # Shims outlive containerd; they are the ones in the node's mount namespace.
    for p in $(pgrep -f "containerd-shim-runc-v2 " || true); do
      [[ -n "${mntns}" && "$(readlink "/proc/${p}/ns/mnt" 2>/dev/null)" == "${mntns}" ]] &&
        kill -9 "${p}" 2>/dev/null || true
    done
    sleep 0.3
  done
  [[ -n "${pid:-}" ]] && kill -9 "${pid}" 2>/dev/null || true
  ip link del "${HOST_IF}" 2>/dev/null || true
  for cg in $(cgroup_dirs); do
    [[ -d "${cg}${CGROUP_ROOT}" ]] && find "${cg}${CGROUP_ROOT}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  if kc get node "${NODE}" >/dev/null 2>&1; then
    kc delete node "${NODE}" --wait=false >/dev/null 2>&1 || true
  fi
  # overlay mounts were in the node's own mount namespace: gone with it; plain files remain.
  rm -rf "${STATE}" 2>/dev/null || true
  [[ -n "${quiet}" ]] || log "node ${NODE} stopped and removed"
}

cmd_status() {
  if pid_of >/dev/null && node_ready; then
    log "node ${NODE} is Ready"
  else
    log "node ${NODE} is not running"
    return 1
  fi
}

# up and down of one node are serialized (parallel pytest sessions share the cluster).
lock() {
  mkdir -p "${CLUSTER_DIR}"
  exec 7>"${CLUSTER_DIR}/.realnode-lock"
  flock -w 300 7 || die "could not lock ${CLUSTER_DIR}/.realnode-lock within 300s"
}

case "${1:-}" in
  up) lock && cmd_up ;;
  down) lock && cmd_down ;;
  import)
    shift
    cmd_import "$@"
    ;;
  status) cmd_status ;;
  name) echo "${NODE}" ;;
  host-ip) echo "${HOST_IP}" ;;
  prereqs)
    m="$(missing_prereqs)"
    [[ -z "${m}" ]] || { printf 'missing: %s\n' "$(tr '\n' ' ' <<<"${m}")" >&2; exit 1; }
    ;;
  *)
    echo "usage: $0 up|down|import TAR...|status|name|host-ip|prereqs|cert-sans" >&2
    exit 2
    ;;
esac
