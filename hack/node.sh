#!/usr/bin/env bash
# Real nodes for the local test cluster: each a kubelet + containerd + runc + CNI (bridge,
# host-local) + CoreDNS in its own network and mount namespaces, joined to the kwokctl control
# plane of hack/cluster.sh beside its fake kwok nodes.
#
#   hack/node.sh up [TAR..]   start (or reuse) the real nodes of cluster $TORCHJOB_CLUSTER_NAME:
#                             $TORCHJOB_REAL_NODES of them (1 to 8, default 1), <cluster>-real-K;
#                             with image tars, each node started begins with those images
#                             imported and unpacked (a seeded root, hard-linked: node-roots.sh)
#   hack/node.sh down         stop them all and remove their state (also `hack/cluster.sh down`)
#   hack/node.sh import TAR.. import docker-archive image tars into every running node's
#                             containerd (a tar already imported into a node is skipped)
#   hack/node.sh seed TAR..   prepare the seeded root of these image tars (node-roots.sh) and
#                             print its path, with no cluster or node: what the first `up`
#                             with them would do (`make node-images`; CI does it beside the venv)
#   hack/node.sh status       exit 0 when the $TORCHJOB_REAL_NODES nodes run and are Ready
#   hack/node.sh name         print node 0's name;  names: every node's, one a line
#   hack/node.sh host-ip      print the host's address on the nodes' network: pods reach the
#                             machine there (the API server; tests/s3.py's object store)
#   hack/node.sh prereqs      exit 0 when every prerequisite is installed, else say what is missing
# Node faults (NODE: a node's name or its index K):
#   hack/node.sh vanish NODE  cut the node's link (its port leaves the nodes' bridge: every
#                             packet to and from it is dropped, no RST, no ICMP, no ARP) and
#                             freeze every process of it (kubelet, containerd, shims, CoreDNS,
#                             the pods' containers: one freezer cgroup), so that nothing it held
#                             answers, resets or reports; the node controller marks it Unknown
#                             after node-monitor-grace-period (40 s here)
#   hack/node.sh reclaim NODE a vanished node's VM is gone, and its memory with it: kill its
#                             pods' processes (its daemons stay frozen, its link cut: no one
#                             hears of it), so that its pods stop holding this machine's memory
#   hack/node.sh return NODE  thaw it and restore its link; undo what `notice` set (taint,
#                             condition, cordon); wait until it is Ready again
#   hack/node.sh partition A B  cut the link between nodes A and B only (every packet between
#                             them, and between their pods, dropped silently in A's namespace);
#                             each still reaches the API server, the host and the other nodes
#   hack/node.sh heal A B     restore the link that `partition A B` cut
#   hack/node.sh notice NODE [--provider aws|karpenter|karpenter-v0|gke] [--drain-after S]
#                            [--vanish-after T] [--condition TYPE]
#                             what a termination handler does: at once the provider's taint
#                             (NoSchedule; and a Node condition TYPE=True if asked), after S
#                             seconds (default 0) a drain through the Eviction API (kubectl
#                             drain: cordon, evict, wait), and at T seconds from the notice
#                             (default 120; gke 30) the node vanishes. Blocks until then.
#
# Isolation (several clusters share one machine, and the machine itself is never changed):
# - each node lives in its own network namespace and a private mount namespace (unshare). The
#   nodes' network (10.213.IDX.0/24; IDX from the cluster name, or $TORCHJOB_NODE_NET_INDEX) is
#   a bridge in a namespace of its own (the "fabric", held by one process): every node has a
#   veth into it (10.213.IDX.K+2), and so has the host: the only change to the machine's network
#   is that one veth pair, tjh<IDX> on the host side with 10.213.IDX.1/24 (and permanent
#   neighbour entries on it). Pods of node K get 10.214.IDX.32*K/27 on a bridge inside K's
#   namespace; every node routes the other nodes' pod ranges via their addresses (no tunnel, no
#   NAT between pods; every MAC is fixed and every neighbour entry permanent, so no ARP crosses
#   the fabric). No namespace has a default route: pods reach pods, nodes and the API server,
#   nothing off the machine;
# - no kube-proxy: it would rewrite iptables chains that every cluster shares. Inside each
#   node's own namespace one DNAT rule sends the `kubernetes` Service (ClusterIP:443) to the API
#   server, which is what in-cluster clients (the operator, rank 0's status reports) use;
#   headless Services (the workers') need no proxy. Other ClusterIP Services do not work here;
# - each node runs a CoreDNS on its own address inside its namespace (port 53 there collides
#   with nothing) for its pods; kubelet's port 10250 is in that namespace too;
# - kubelet writes to fixed paths (/var/lib/kubelet, /var/log/pods, ...): they are bind mounts
#   of the node's state directory inside its private mount namespace; the few /proc/sys
#   files kubelet wants to set are bind-mounted regular files holding the values it expects,
#   so the machine's sysctls stay as they are;
# - node K's pods' cgroups live under /torchjob-<cluster>/real-K in every cgroup v1 hierarchy
#   (kubelet failCgroupV1: false; containerd restrict_oom_score_adj: no CAP_SYS_RESOURCE here);
#   its daemons are in the freezer cgroup /torchjob-<cluster>/real-K/node (v1: only in the
#   freezer hierarchy), so that freezing /torchjob-<cluster>/real-K stops the whole node.
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
STATE_ROOT="${CLUSTER_DIR}/realnode"
NODE_LABEL="torchjob.io/real-node"
INDEX_LABEL="torchjob.io/real-node-index"
# containerd's socket, at its usual path inside each node's mount namespace, where
# /run/containerd is a bind mount of that node's state (a socket path under the state directory
# would be too long for a unix socket); from outside: nsenter --target <node.pid> --mount.
SOCK=/run/containerd/containerd.sock
MAX_NODES=8 # eight /27 pod ranges (29 pods a node) in the cluster's 10.214.IDX.0/24
LAYOUT="pods /27, ${MAX_NODES} slots" # nodes started with another layout are started anew

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] error: %s\n' "$*" >&2; exit 1; }
kc() { "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }
# kc, tried up to 5 times 3 s apart: on a loaded machine the API server may miss kubectl's
# 10 s TLS handshake (seen: "net/http: TLS handshake timeout" failed every real node's start).
kc_retry() {
  local try
  for try in 1 2 3 4; do
    kc "$@" && return 0
    sleep 3
  done
  kc "$@"
}
now_ms() { date +%s%3N; }
# shellcheck source=node-roots.sh
source "${HACK_DIR}/node-roots.sh"
SEED=() # cmd_up: the image archives a node it starts is seeded with

COUNT="${TORCHJOB_REAL_NODES:-1}"
[[ "${COUNT}" =~ ^[1-9][0-9]*$ && "${COUNT}" -le "${MAX_NODES}" ]] ||
  die "TORCHJOB_REAL_NODES=${COUNT}: a number of real nodes from 1 to ${MAX_NODES}"

net_index() {
  if [[ -n "${TORCHJOB_NODE_NET_INDEX:-}" ]]; then
    echo "${TORCHJOB_NODE_NET_INDEX}"
  else
    echo $(($(printf '%s' "${NAME}" | cksum | cut -d' ' -f1) % 200 + 20))
  fi
}
IDX="$(net_index)"
[[ "${IDX}" =~ ^[0-9]+$ && "${IDX}" -le 255 ]] || die "TORCHJOB_NODE_NET_INDEX=${IDX}: a number from 0 to 255"
HOST_IF="tjh${IDX}"
NODE_IF="tjn0"
HOST_IP="10.213.${IDX}.1"
PODS_NET="10.214.${IDX}.0/24"
HOST_MAC="$(printf '02:74:6a:%02x:00:01' "${IDX}")"
CGROUP_ROOT="/torchjob-${NAME}"
FABRIC_PIDFILE="${STATE_ROOT}/fabric.pid"

# What cluster.sh needs at creation for a real node to work: extra API server cert SANs.
if [[ "${1:-}" == "cert-sans" ]]; then
  echo "${HOST_IP}"
  exit 0
fi

node_ip() { echo "10.213.${IDX}.$(($1 + 2))"; }
node_mac() { printf '02:74:6a:%02x:01:%02x' "${IDX}" "$1"; }
pod_cidr() { echo "10.214.${IDX}.$((32 * $1))/27"; }

# select_node K: the globals of node K (its name, addresses, state directory, cgroup).
select_node() {
  K="$1"
  NODE="${NAME}-real-${K}"
  NODE_IP="$(node_ip "${K}")"
  NODE_MAC="$(node_mac "${K}")"
  POD_CIDR="$(pod_cidr "${K}")"
  STATE="${STATE_ROOT}/real-${K}"
  NODE_CG="${CGROUP_ROOT}/real-${K}"
}

# node_index NODE: K for a node's name or index (of this cluster).
node_index() {
  local n="${1:?a node name or index}"
  [[ "${n}" =~ ^[0-9]+$ ]] || n="${n#"${NAME}-real-"}"
  [[ "${n}" =~ ^[0-9]+$ && "${n}" -lt "${MAX_NODES}" ]] || die "no real node '$1' in cluster '${NAME}' (names: ${NAME}-real-0 to ${NAME}-real-$((MAX_NODES - 1)))"
  echo "${n}"
}
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

pid_of() { # the selected node's namespace holder (the inner script), when it runs
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
    # The kubelet's last: a caller keeps the end of this (tests/cluster/realnode.py), and
    # containerd's config line alone is 3 KB, so every line is cut.
    for f in containerd coredns inside kubelet; do
      echo "--- ${STATE}/${f}.log (tail)"
      tail -25 "${STATE}/${f}.log" 2>/dev/null | cut -c1-300 || true
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


fabric_pid() { # the holder of the nodes' network namespace, when it runs
  local pid
  pid="$(cat "${FABRIC_PIDFILE}" 2>/dev/null)" || return 1
  [[ "${pid}" =~ ^[0-9]+$ ]] && kill -0 "${pid}" 2>/dev/null &&
    grep -q "torchjob-fabric" "/proc/${pid}/cmdline" 2>/dev/null && echo "${pid}"
}

in_fabric() { nsenter --target "$(fabric_pid)" --net "$@"; }

# The cgroup files that freeze a node: v1 its freezer cgroup, v2 its cgroup.
freezer_dir() {
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    echo "/sys/fs/cgroup${NODE_CG}"
  else
    echo "/sys/fs/cgroup/freezer${NODE_CG}"
  fi
}

set_frozen() { # set_frozen 1|0: freeze or thaw the selected node's cgroup, wait until done
  local dir want i
  dir="$(freezer_dir)"
  [[ -d "${dir}" ]] || die "no freezer cgroup ${dir} for node ${NODE}"
  if [[ -f "${dir}/cgroup.freeze" ]]; then
    echo "$1" >"${dir}/cgroup.freeze"
    want="frozen $1"
    for i in $(seq 300); do grep -qx "${want}" "${dir}/cgroup.events" && return 0; sleep 0.1; done
  elif [[ "$1" == 0 ]]; then
    want=THAWED
    for i in $(seq 300); do
      echo THAWED >"${dir}/freezer.state"
      [[ "$(cat "${dir}/freezer.state")" == THAWED ]] && return 0
      sleep 0.1
    done
  else
    # v1's freezer never finishes while a task is in an exec (runc starting a container):
    # the exec waits, uninterruptibly, for its other threads to exit, and they are frozen,
    # so the cgroup stays FREEZING (seen in the fleet bench, 2026-11-30). Each try waits
    # 2 s; a try that did not finish thaws for 0.2 s (the exec completes; the link is cut
    # already, so nothing the node says reaches anyone) and freezes again.
    want=FROZEN
    for i in $(seq 15); do
      echo FROZEN >"${dir}/freezer.state"
      for _ in $(seq 20); do
        [[ "$(cat "${dir}/freezer.state")" == FROZEN ]] && return 0
        sleep 0.1
      done
      log "node ${NODE} still freezing after 2s (a task in an exec?): thawing 0.2s, then again"
      echo THAWED >"${dir}/freezer.state"
      sleep 0.2
    done
  fi
  die "node ${NODE}'s cgroup ${dir} did not become ${want} within 30s"
}

is_frozen() {
  local dir
  dir="$(freezer_dir)"
  if [[ -f "${dir}/cgroup.freeze" ]]; then
    [[ "$(cat "${dir}/cgroup.freeze")" == 1 ]]
  else
    [[ -f "${dir}/freezer.state" && "$(cat "${dir}/freezer.state")" != THAWED ]]
  fi
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
  "name": "torchjob-${NAME}-${K}",
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
cgroupRoot: ${NODE_CG}
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
NODE_IF="$8"; SVC_IP="$9"; API_PORT="${10}"; NODE_LABELS="${11}"; PODS_NET="${12}"
FREEZER_PROCS="${13}"; HOST_MAC="${14}"; PEERS="${15}"; shift 15
SYSCTLS=("$@")
exec >>"${STATE}/inside.log" 2>&1
# Into the node's freezer cgroup before anything starts: every process of the node inherits it.
echo $$ >"${FREEZER_PROCS}"
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
ip addr add "${NODE_IP}/24" dev "${NODE_IF}"
ip link set "${NODE_IF}" up
# The other nodes' pod ranges via their addresses, every neighbour permanent (no ARP: a node
# that vanished stays silent, as in a cloud network); PEERS: "ip,mac,cidr ..." of every slot.
ip neigh replace "${HOST_IP}" lladdr "${HOST_MAC}" dev "${NODE_IF}" nud permanent
for peer in ${PEERS}; do
  IFS=, read -r ip mac cidr <<<"${peer}"
  ip neigh replace "${ip}" lladdr "${mac}" dev "${NODE_IF}" nud permanent
  ip route replace "${cidr}" via "${ip}" dev "${NODE_IF}"
done
# This namespace's own forwarding (pods <-> node); no default route, so nothing leaves.
echo 1 >/proc/sys/net/ipv4/ip_forward
# The `kubernetes` Service -> the API server at the host end of the veth.
iptables -t nat -A PREROUTING -d "${SVC_IP}/32" -p tcp --dport 443 -j DNAT --to-destination "${HOST_IP}:${API_PORT}"
iptables -t nat -A OUTPUT -d "${SVC_IP}/32" -p tcp --dport 443 -j DNAT --to-destination "${HOST_IP}:${API_PORT}"
# Pods reach the host (API server, object store) as the node; pods of other nodes see pod IPs.
iptables -t nat -A POSTROUTING -s "${POD_CIDR}" ! -d "${PODS_NET}" -o "${NODE_IF}" -j MASQUERADE
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
# kubelet (leases, status, probes) and CoreDNS (the rendezvous' names) at niceness -10, as the
# control plane (hack/cluster.sh): on a loaded machine a kubelet that waits behind torch workers
# lets its lease lapse and the node is taken for lost. The containers' processes are scheduled
# by their pods' cgroups (cpu.shares), whatever their niceness.
nice -n -10 "${COREDNS}" -conf "${STATE}/Corefile" >>"${STATE}/coredns.log" 2>&1 &
pids+=($!)
nice -n -10 "${KUBELET}" --config "${STATE}/kubelet/config.yaml" --kubeconfig "${STATE}/kubeconfig.yaml" \
  --hostname-override "${NODE}" --node-ip "${NODE_IP}" \
  --node-labels "${NODE_LABELS}" \
  --v 1 >>"${STATE}/kubelet.log" 2>&1 &
pids+=($!)
echo "[$(date -u +%T)] started containerd, coredns, kubelet: ${pids[*]}"
# Stop everything when any of them dies: hack/node.sh notices and reports.
wait -n "${pids[@]}" || true
echo "[$(date -u +%T)] a node process exited"
EOF
  chmod +x "${STATE}/node-inside.sh"
}

setup_cgroups() { # the selected node's cgroups: its pods' root in every hierarchy, its freezer
  local cg dir
  for cg in $(cgroup_dirs); do
    for dir in "${cg}${CGROUP_ROOT}" "${cg}${NODE_CG}"; do
      mkdir -p "${dir}"
      if [[ -f "${cg}/cpuset.cpus" ]]; then
        cat "${cg}/cpuset.cpus" >"${dir}/cpuset.cpus"
        cat "${cg}/cpuset.mems" >"${dir}/cpuset.mems"
      fi
      # The weight kubelet gives kubepods at the machine's root (1024 per CPU): without it all
      # of the nodes' containers together weigh as much as one process outside them. The
      # nodes of a cluster weigh the same among themselves.
      if [[ -f "${dir}/cpu.shares" ]]; then
        echo $(($(nproc) * 1024)) >"${dir}/cpu.shares"
      fi
    done
  done
  mkdir -p "$(freezer_dir)/node"
}

# The nodes' network: a bridge in a namespace of its own, the host's veth into it.
ensure_fabric() {
  if fabric_pid >/dev/null && ip link show "${HOST_IF}" >/dev/null 2>&1; then
    return
  fi
  if ip -4 route show | grep -qE "^10\.21[34]\.${IDX}\."; then
    die "10.213.${IDX}.0/24 or 10.214.${IDX}.0/24 is already routed on this machine; set TORCHJOB_NODE_NET_INDEX to a free 0-255"
  fi
  mkdir -p "${STATE_ROOT}"
  setsid unshare --net bash -c "exec -a torchjob-fabric-${NAME} sleep infinity" </dev/null >/dev/null 2>&1 7>&- &
  local pid=$! i
  echo "${pid}" >"${FABRIC_PIDFILE}"
  for i in $(seq 50); do [[ "$(readlink "/proc/${pid}/ns/net")" != "$(readlink /proc/self/ns/net)" ]] && fabric_pid >/dev/null && break; sleep 0.1; done
  fabric_pid >/dev/null || die "the nodes' network namespace did not start"
  in_fabric sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 || true
  in_fabric ip link set lo up
  in_fabric ip link add br0 type bridge
  in_fabric ip link set br0 up
  ip link add "${HOST_IF}" address "${HOST_MAC}" type veth peer name up0 netns "${pid}"
  in_fabric ip link set up0 master br0
  in_fabric ip link set up0 up
  ip addr add "${HOST_IP}/24" dev "${HOST_IF}"
  ip link set "${HOST_IF}" up
}

# start_node: the selected node's namespaces, processes and link (does not wait for Ready).
start_node() {
  write_configs
  [[ ${#SEED[@]} == 0 ]] || seed_node "${SEED[@]}" || die "could not seed ${NODE}'s containerd root"
  write_inside
  setup_cgroups
  local svc_ip kv sysctls=() j peers=""
  svc_ip="$(kc_retry get service kubernetes -n default -o jsonpath='{.spec.clusterIP}')"
  for kv in "${SYSCTLS[@]}"; do sysctls+=("${kv}"); done
  for ((j = 0; j < MAX_NODES; j++)); do
    [[ "${j}" == "${K}" ]] || peers+="$(node_ip "${j}"),$(node_mac "${j}"),$(pod_cidr "${j}") "
  done
  setsid unshare --mount --net --propagation private \
    "${STATE}/node-inside.sh" "${STATE}" "${KUBELET}" "${COREDNS}" "${NODE}" "${NODE_IP}" \
    "${HOST_IP}" "${POD_CIDR}" "${NODE_IF}" "${svc_ip}" "${API_PORT}" \
    "${NODE_LABEL}=true,${INDEX_LABEL}=${K},kubernetes.io/os=linux" "${PODS_NET}" \
    "$(freezer_dir)/node/cgroup.procs" "${HOST_MAC}" "${peers}" \
    "${sysctls[@]}" </dev/null >>"${STATE}/inside.log" 2>&1 7>&- &
  local pid=$! i
  echo "${pid}" >"${STATE}/node.pid"
  for i in $(seq 50); do [[ "$(readlink "/proc/${pid}/ns/net")" != "$(readlink /proc/self/ns/net)" ]] && break; sleep 0.1; done
  readlink "/proc/${pid}/ns/mnt" >"${STATE}/node.mntns"
  # The node's link: a veth from the fabric's bridge (port nK) into its namespace.
  in_fabric ip link add "n${K}" type veth peer name "${NODE_IF}" address "${NODE_MAC}" netns "${pid}"
  in_fabric ip link set "n${K}" master br0
  in_fabric ip link set "n${K}" up
  ip neigh replace "${NODE_IP}" lladdr "${NODE_MAC}" dev "${HOST_IF}" nud permanent
}

await_node() { # the selected node registered and Ready (dies otherwise: run it in a subshell to go on)
  wait_until 120 "node ${NODE} to register" kc get node "${NODE}"
  wait_until 120 "node ${NODE} to become Ready" node_ready
}

cmd_up() {
  local start missing k started=() tar
  start=$(now_ms)
  SEED=("$@")
  for tar in "${SEED[@]}"; do [[ -s "${tar}" ]] || die "no image archive ${tar}"; done
  missing="$(missing_prereqs)"
  [[ -z "${missing}" ]] || die "missing prerequisites: $(tr '\n' ' ' <<<"${missing}")(Debian: apt-get install containerd runc containernetworking-plugins iptables iproute2; then make testbin)"
  kc_retry get --raw /readyz >/dev/null 2>&1 || die "cluster '${NAME}' is not running (hack/cluster.sh up)"
  if [[ -f "${STATE_ROOT}/node.pid" ]] || [[ "$(cat "${STATE_ROOT}/layout" 2>/dev/null)" != "${LAYOUT}" ]] ||
    ! fabric_pid >/dev/null || ! ip link show "${HOST_IF}" >/dev/null 2>&1; then
    cmd_down quiet # nodes of an older hack/node.sh (or its pod ranges), or a broken network
  fi
  ensure_fabric
  echo "${LAYOUT}" >"${STATE_ROOT}/layout"
  PAUSE_IMAGE="$("${HACK_DIR}/images.sh" ref pause)"
  for ((k = 0; k < COUNT; k++)); do
    select_node "${k}"
    if pid_of >/dev/null && node_ready && ! is_frozen; then
      continue
    fi
    down_node
    start_node
    started+=("${k}")
  done
  if [[ ${#started[@]} == 0 ]]; then
    log "${COUNT} real node(s) already running (checked in $(($(now_ms) - start))ms)"
    return
  fi
  for k in "${started[@]}"; do
    select_node "${k}"
    # Once more from nothing when its processes exit before it is Ready: seen once in CI, a
    # node's process exited a second after it started, and every real-node test failed.
    if ! (await_node); then
      log "node ${NODE} did not come up (the diagnosis above); starting it once more"
      down_node
      start_node
      await_node
    fi
    log "node ${NODE} Ready (${NODE_IP}, pods ${POD_CIDR}, state ${STATE})"
  done
  log "${COUNT} real node(s) Ready in $(($(now_ms) - start))ms (started ${#started[@]}; host ${HOST_IP})"
}

running_nodes() { # the indexes of the nodes whose processes run
  local k
  for ((k = 0; k < MAX_NODES; k++)); do
    select_node "${k}"
    pid_of >/dev/null && echo "${k}"
  done
  return 0
}

import_node() { # import_node TAR...: into the selected node, each tar once
  local pid tar start
  pid="$(pid_of)" || die "node ${NODE} is not running (hack/node.sh up)"
  ! is_frozen || die "node ${NODE} has vanished (hack/node.sh return ${NODE})"
  for tar in "$@"; do
    grep -qxF "${tar}" "${STATE}/imported" 2>/dev/null && continue
    start=$(now_ms)
    nsenter --target "${pid}" --mount ctr --address "${SOCK}" -n k8s.io images import --no-unpack "${tar}" >/dev/null ||
      die "ctr images import ${tar} into ${NODE} failed"
    echo "${tar}" >>"${STATE}/imported"
    log "imported ${tar##*/} into ${NODE} in $(($(now_ms) - start))ms"
  done
}

cmd_import() {
  local k pids=() rc=0 p nodes
  nodes="$(running_nodes)"
  [[ -n "${nodes}" ]] || die "no real node of cluster '${NAME}' is running (hack/node.sh up)"
  for k in ${nodes}; do
    select_node "${k}"
    import_node "$@" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "${p}" || rc=1; done
  return "${rc}"
}

down_node() { # stop the selected node, remove its state, its Node
  local pid mntns cg p
  mntns="$(cat "${STATE}/node.mntns" 2>/dev/null || true)"
  # A frozen process takes no signal (cgroup v1): thaw first.
  [[ -d "$(freezer_dir)" ]] && is_frozen && set_frozen 0
  [[ -d "$(freezer_dir)/node" ]] && set_daemons_frozen 0
  if pid="$(pid_of)"; then
    kill "${pid}" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.1; done
  fi
  # Whatever still runs in this node's cgroups (containers, shims, daemons).
  for _ in 1 2 3; do
    for cg in $(cgroup_dirs); do
      [[ -d "${cg}${NODE_CG}" ]] || continue
      for p in $(find "${cg}${NODE_CG}" -name cgroup.procs -exec cat {} + 2>/dev/null); do
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
  fabric_pid >/dev/null && in_fabric ip link del "n${K}" 2>/dev/null || true
  for cg in $(cgroup_dirs); do
    [[ -d "${cg}${NODE_CG}" ]] && find "${cg}${NODE_CG}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  if [[ -d "${STATE}" ]] && kc get node "${NODE}" >/dev/null 2>&1; then
    kc delete node "${NODE}" --wait=false >/dev/null 2>&1 || true
  fi
  # overlay mounts were in the node's own mount namespace: gone with it; plain files remain.
  rm -rf "${STATE}" 2>/dev/null || true
}

cmd_down() {
  local quiet="${1:-}" k pid cg p
  for ((k = 0; k < MAX_NODES; k++)); do
    select_node "${k}"
    if [[ -d "${STATE}" ]] || [[ -d "$(freezer_dir)" ]]; then
      down_node
      [[ -n "${quiet}" ]] || log "node ${NODE} stopped and removed"
    fi
  done
  # A node of an older hack/node.sh (its state directly in realnode/, cgroups in /torchjob-NAME).
  if pid="$(cat "${STATE_ROOT}/node.pid" 2>/dev/null)" && [[ "${pid}" =~ ^[0-9]+$ ]] &&
    grep -q "node-inside" "/proc/${pid}/cmdline" 2>/dev/null; then
    kill "${pid}" 2>/dev/null || true
    sleep 1
    for cg in $(cgroup_dirs); do
      for p in $(find "${cg}${CGROUP_ROOT}" -name cgroup.procs -exec cat {} + 2>/dev/null); do
        kill -9 "${p}" 2>/dev/null || true
      done
    done
    kill -9 "${pid}" 2>/dev/null || true
    kc delete node "${NAME}-real-0" --wait=false >/dev/null 2>&1 || true
  fi
  if pid="$(fabric_pid)"; then
    kill "${pid}" 2>/dev/null || true
  fi
  ip link del "${HOST_IF}" 2>/dev/null || true
  for cg in $(cgroup_dirs); do
    [[ -d "${cg}${CGROUP_ROOT}" ]] && find "${cg}${CGROUP_ROOT}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  rm -rf "${STATE_ROOT}" 2>/dev/null || true
}

cmd_status() {
  local k ok=0
  for ((k = 0; k < COUNT; k++)); do
    select_node "${k}"
    if pid_of >/dev/null && node_ready && ! is_frozen; then
      log "node ${NODE} is Ready"
    elif pid_of >/dev/null && is_frozen; then
      log "node ${NODE} has vanished (frozen, link cut)"
      ok=1
    else
      log "node ${NODE} is not running"
      ok=1
    fi
  done
  return "${ok}"
}

# --- node faults -------------------------------------------------------------------------

cmd_vanish() {
  select_node "$(node_index "${1:-}")"
  pid_of >/dev/null || die "node ${NODE} is not running"
  fabric_pid >/dev/null || die "the nodes' network of cluster '${NAME}' is not running"
  # The link first (its port leaves the bridge: frames to and from it go nowhere, silently),
  # then every process of the node stops where it is.
  in_fabric ip link set "n${K}" nomaster
  set_frozen 1
  date +%s >"${STATE}/vanished"
  log "node ${NODE} vanished (link cut, processes frozen)"
}

# The processes of the selected node's pods: every task in its freezer cgroup but its daemons'.
pod_tasks() {
  find "$(freezer_dir)" -mindepth 1 -path "$(freezer_dir)/node" -prune -o -name cgroup.procs -print0 |
    xargs -0 -r cat 2>/dev/null
}

set_daemons_frozen() { # set_daemons_frozen 1|0: the node's daemons (its cgroup's node/) alone
  local dir
  dir="$(freezer_dir)/node"
  if [[ -f "${dir}/cgroup.freeze" ]]; then
    echo "$1" >"${dir}/cgroup.freeze"
    [[ "$(cat "${dir}/cgroup.freeze")" == "$1" ]]
  else
    if [[ "$1" == 1 ]]; then echo FROZEN >"${dir}/freezer.state"; else echo THAWED >"${dir}/freezer.state"; fi
    [[ "$(cat "${dir}/freezer.self_freezing")" == "$1" ]]
  fi || die "node ${NODE}'s daemons' cgroup ${dir} did not take freeze=$1"
}

cmd_reclaim() {
  select_node "$(node_index "${1:-}")"
  [[ -f "${STATE}/vanished" ]] || die "node ${NODE} has not vanished (hack/node.sh vanish ${NODE})"
  # A frozen task takes no SIGKILL (cgroup v1): the daemons (kubelet, containerd, the shims)
  # freeze on their own, the node's cgroup thaws, and its pods' processes are killed. The link
  # stays cut, so what they close on the way out (FIN, RST) reaches no one.
  set_daemons_frozen 1
  set_frozen 0
  local p i left
  for i in $(seq 50); do
    left=0
    for p in $(pod_tasks); do
      kill -9 "${p}" 2>/dev/null || true
      left=$((left + 1))
    done
    [[ "${left}" == 0 ]] && break
    sleep 0.1
  done
  set_frozen 1
  [[ "${left}" == 0 ]] || die "node ${NODE}: ${left} of its pods' processes still alive after 5s"
  log "node ${NODE} reclaimed (its pods' processes killed; daemons frozen, link cut)"
}

cmd_return() {
  local wait=1
  [[ "${2:-}" == "--no-wait" ]] && wait=0
  select_node "$(node_index "${1:-}")"
  pid_of >/dev/null || die "node ${NODE} is not running"
  set_frozen 0
  set_daemons_frozen 0 # after `reclaim`, the daemons were frozen on their own as well
  in_fabric ip link set "n${K}" master br0
  rm -f "${STATE}/vanished"
  if [[ -f "${STATE}/notice" ]]; then
    local taint condition
    read -r taint condition <"${STATE}/notice"
    kc taint node "${NODE}" "${taint}-" >/dev/null 2>&1 || true
    if [[ -n "${condition}" ]]; then
      # conditions is a list keyed by type: a strategic-merge $patch: delete removes one.
      kc patch node "${NODE}" --subresource=status --type=strategic \
        -p "{\"status\":{\"conditions\":[{\"type\":\"${condition}\",\"\$patch\":\"delete\"}]}}" >/dev/null || true
    fi
    kc uncordon "${NODE}" >/dev/null
    rm -f "${STATE}/notice"
  fi
  log "node ${NODE} returned (thawed, link restored)"
  if [[ "${wait}" == 1 ]]; then
    wait_until 120 "node ${NODE} to be Ready again" node_ready
    log "node ${NODE} is Ready again"
  fi
}

# partition_rules PID -I|-D IP CIDR: in the namespace of node PID, drop (or stop dropping)
# every packet to and from node IP and the pods of CIDR: what crosses between two nodes'
# pods is forwarded by each node's namespace, so one side's rules cut both directions.
partition_rules() {
  local pid="$1" act="$2" ip="$3" cidr="$4" spec
  for spec in "FORWARD -s ${cidr}" "FORWARD -d ${cidr}" "INPUT -s ${ip}" "OUTPUT -d ${ip}"; do
    # shellcheck disable=SC2086 # the rule's words
    nsenter --target "${pid}" --net iptables -w ${act} ${spec} -j DROP || return 1
  done
}

cmd_partition() { # cmd_partition -I|-D A B
  local act="$1" a b pid b_ip b_cidr b_name
  a="$(node_index "${2:-}")" && b="$(node_index "${3:-}")" || exit 1
  [[ "${a}" != "${b}" ]] || die "partition: two different nodes (got ${2} twice)"
  select_node "${b}"
  b_ip="${NODE_IP}" b_cidr="${POD_CIDR}" b_name="${NODE}"
  pid_of >/dev/null || die "node ${NODE} is not running"
  select_node "${a}"
  pid="$(pid_of)" || die "node ${NODE} is not running"
  if [[ "${act}" == -I ]]; then
    grep -qx "${b}" "${STATE}/partitioned" 2>/dev/null && die "${NODE} and ${b_name} are already partitioned"
    partition_rules "${pid}" -I "${b_ip}" "${b_cidr}" || die "could not cut ${NODE} from ${b_name} (iptables in ${NODE}'s namespace)"
    echo "${b}" >>"${STATE}/partitioned"
    log "partition: ${NODE} and ${b_name} no longer reach each other (nor their pods)"
  else
    grep -qx "${b}" "${STATE}/partitioned" 2>/dev/null || die "${NODE} and ${b_name} are not partitioned (hack/node.sh partition ${a} ${b})"
    partition_rules "${pid}" -D "${b_ip}" "${b_cidr}" || die "could not heal ${NODE} and ${b_name}"
    grep -vx "${b}" "${STATE}/partitioned" >"${STATE}/partitioned.new" || true
    mv "${STATE}/partitioned.new" "${STATE}/partitioned"
    log "healed: ${NODE} and ${b_name} reach each other again"
  fi
}

notice_taint() { # the taint a termination handler puts on a node it was told will go
  case "$1" in
    aws) echo "aws-node-termination-handler/spot-itn=spot-itn-$(date +%s):NoSchedule" ;;
    karpenter) echo "karpenter.sh/disrupted:NoSchedule" ;;
    karpenter-v0) echo "karpenter.sh/disruption=disrupting:NoSchedule" ;;
    gke) echo "cloud.google.com/impending-node-termination:NoSchedule" ;;
    *) die "notice --provider $1: one of aws, karpenter, karpenter-v0, gke" ;;
  esac
}

cmd_notice() {
  local node="${1:-}" provider=aws drain_after=0 vanish_after="" condition=""
  shift || true
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --provider) provider="${2:?--provider NAME}"; shift 2 ;;
      --drain-after) drain_after="${2:?--drain-after SECONDS}"; shift 2 ;;
      --vanish-after) vanish_after="${2:?--vanish-after SECONDS}"; shift 2 ;;
      --condition) condition="${2:?--condition TYPE}"; shift 2 ;;
      *) die "notice: unknown option $1" ;;
    esac
  done
  if [[ -z "${vanish_after}" ]]; then
    if [[ "${provider}" == gke ]]; then vanish_after=30; else vanish_after=120; fi
  fi
  [[ "${drain_after}" =~ ^[0-9]+$ ]] || die "notice --drain-after ${drain_after}: whole seconds"
  [[ "${vanish_after}" =~ ^[0-9]+$ ]] || die "notice --vanish-after ${vanish_after}: whole seconds"
  ((vanish_after > drain_after)) || die "notice: --vanish-after (${vanish_after}) must be later than --drain-after (${drain_after})"
  [[ -z "${condition}" || "${condition}" =~ ^[A-Za-z][A-Za-z0-9]*$ ]] || die "notice --condition ${condition}: a condition type (letters and digits)"
  local taint t0 now
  t0=$(now_ms)
  taint="$(notice_taint "${provider}")"
  select_node "$(node_index "${node}")"
  pid_of >/dev/null || die "node ${NODE} is not running"
  kc taint node "${NODE}" "${taint}" --overwrite >/dev/null
  echo "${taint%%[=:]*}:NoSchedule ${condition}" >"${STATE}/notice"
  if [[ -n "${condition}" ]]; then
    now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    kc patch node "${NODE}" --subresource=status --type=strategic -p "{\"status\":{\"conditions\":[{\"type\":\"${condition}\",\"status\":\"True\",\"reason\":\"TerminationNotice\",\"message\":\"${provider}: the node goes in ${vanish_after}s\",\"lastHeartbeatTime\":\"${now}\",\"lastTransitionTime\":\"${now}\"}]}}" >/dev/null
  fi
  log "notice (${provider}) on ${NODE}: taint ${taint}${condition:+, condition ${condition}}; drain in ${drain_after}s, vanish in ${vanish_after}s"
  while (($(now_ms) - t0 < drain_after * 1000)); do sleep 0.1; done
  log "draining ${NODE} (Eviction API)"
  timeout $((vanish_after - drain_after)) "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" drain "${NODE}" \
    --ignore-daemonsets --delete-emptydir-data --force --grace-period=-1 \
    --timeout="$((vanish_after - drain_after))s" >&2 || log "the drain of ${NODE} did not finish before the node goes"
  while (($(now_ms) - t0 < vanish_after * 1000)); do sleep 0.1; done
  lock
  cmd_vanish "${K}"
}

# up and down of the nodes, and their faults, are serialized (parallel pytest sessions share
# the cluster).
lock() {
  mkdir -p "${CLUSTER_DIR}"
  exec 7>"${CLUSTER_DIR}/.realnode-lock"
  flock -w 300 7 || die "could not lock ${CLUSTER_DIR}/.realnode-lock within 300s"
}

case "${1:-}" in
  up)
    shift
    lock && cmd_up "$@"
    ;;
  down) lock && cmd_down ;;
  import)
    shift
    cmd_import "$@"
    ;;
  status) cmd_status ;;
  name) echo "${NAME}-real-0" ;;
  names) for ((k = 0; k < COUNT; k++)); do echo "${NAME}-real-${k}"; done ;;
  host-ip) echo "${HOST_IP}" ;;
  vanish) node_index "${2:-}" >/dev/null && lock && cmd_vanish "${2:-}" ;;
  reclaim) node_index "${2:-}" >/dev/null && lock && cmd_reclaim "${2:-}" ;;
  return) node_index "${2:-}" >/dev/null && lock && cmd_return "${2:-}" "${3:-}" ;;
  partition) lock && cmd_partition -I "${2:-}" "${3:-}" ;;
  heal) lock && cmd_partition -D "${2:-}" "${3:-}" ;;
  notice)
    shift
    cmd_notice "$@"
    ;;
  seed)
    shift
    for tar in "$@"; do [[ -s "${tar}" ]] || die "no image archive ${tar}"; done
    seeded_root "$@"
    ;;
  prereqs)
    m="$(missing_prereqs)"
    [[ -z "${m}" ]] || { printf 'missing: %s\n' "$(tr '\n' ' ' <<<"${m}")" >&2; exit 1; }
    ;;
  *)
    echo "usage: $0 up [TAR...]|down|import TAR...|seed TAR...|status|name|names|host-ip|vanish NODE|reclaim NODE|return NODE|partition A B|heal A B|notice NODE [...]|prereqs|cert-sans" >&2
    exit 2
    ;;
esac
