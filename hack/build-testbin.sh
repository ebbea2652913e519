#!/usr/bin/env bash
# Build (or reuse) the pinned binaries of the local test control plane from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd, kwok, kwokctl, helm,
# krew (as kubectl-krew too, so that `kubectl krew` finds it: the kubectl plugin test).
#
# Every component/version gets its own directory under $TORCHJOB_TESTBIN_ROOT, e.g.
#   ~/.cache/torchjob/testbin/kubernetes-v1.37.2/kube-apiserver
# so bumping one version in hack/versions.env rebuilds only that component. A finished
# directory carries a .stamp; a second run only checks stamps and `--version` outputs.
# Go's own module and build caches (~/go/pkg/mod, ~/.cache/go-build) are used as they are,
# so a rebuild after a cache wipe of the testbin root is mostly linking.
#
# The real-node components (hack/node.sh) are built the same way: kubelet (component "kubelet",
# the same wrapper module as the control plane) and CoreDNS ("coredns").
#
# SeaweedFS ("seaweedfs": only its `weed` binary) is the S3-compatible object store of the
# checkpoint storage tests (tests/s3.py).
#
# Usage: hack/build-testbin.sh [--print-dir COMPONENT] [COMPONENT...]
#   (COMPONENT: kubernetes|etcd|kwok|helm|krew|kubelet|coredns|gitops|podgroup-crds|monitoring-crds|kueue|seaweedfs;
#    default: all)
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"

ROOT="${TORCHJOB_TESTBIN_ROOT:-${HOME}/.cache/torchjob/testbin}"
WORK="${ROOT}/.work"

log() { printf '[testbin] %s\n' "$*" >&2; }
die() { printf '[testbin] error: %s\n' "$*" >&2; exit 1; }

component_dir() {
  case "$1" in
    kubernetes) echo "${ROOT}/kubernetes-${KUBE_VERSION}" ;;
    etcd) echo "${ROOT}/etcd-${ETCD_VERSION}" ;;
    kwok) echo "${ROOT}/kwok-${KWOK_VERSION}" ;;
    helm) echo "${ROOT}/helm-${HELM_VERSION}" ;;
    krew) echo "${ROOT}/krew-${KREW_VERSION}" ;;
    kubelet) echo "${ROOT}/kubelet-${KUBE_VERSION}" ;;
    coredns) echo "${ROOT}/coredns-${COREDNS_VERSION}" ;;
    gitops) echo "${ROOT}/gitops-check-${GOPHER_LUA_VERSION}-${CLI_UTILS_VERSION}" ;;
    podgroup-crds) echo "${ROOT}/podgroup-crds-${SCHEDULER_PLUGINS_VERSION}" ;;
    monitoring-crds) echo "${ROOT}/monitoring-crds-${PROMETHEUS_OPERATOR_VERSION}" ;;
    kueue) echo "${ROOT}/kueue-${KUEUE_VERSION}" ;;
    seaweedfs) echo "${ROOT}/seaweedfs-${SEAWEEDFS_VERSION}" ;;
    *) die "unknown component: $1" ;;
  esac
}

if [[ "${1:-}" == "--print-dir" ]]; then
  component_dir "${2:?component}"
  exit 0
fi

# ---------------------------------------------------------------- toolchain checks
GO="${GO:-go}"
if ! command -v "${GO}" >/dev/null 2>&1; then
  if [[ "${GO}" == "go" && -x /usr/local/go/bin/go ]]; then
    GO=/usr/local/go/bin/go
  else
    die "'${GO}' not found (PATH or \$GO). Install Go >= ${GO_MIN_VERSION} (https://go.dev/dl/) and rerun 'make testbin'."
  fi
fi
go_version="$(GOTOOLCHAIN=local "${GO}" env GOVERSION 2>/dev/null || true)"
go_version="${go_version#go}"
if [[ -z "${go_version}" ]]; then
  die "could not run '${GO} env GOVERSION'; is the Go installation broken?"
fi
if [[ "$(printf '%s\n%s\n' "${GO_MIN_VERSION}" "${go_version}" | sort -V | head -1)" != "${GO_MIN_VERSION}" ]]; then
  die "Go ${go_version} is too old: Kubernetes ${KUBE_VERSION} needs Go >= ${GO_MIN_VERSION}. Install a newer Go (https://go.dev/dl/) and rerun 'make testbin'."
fi

# Never let go.mod's toolchain line silently download another Go; the check above is the gate.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0

stamp_of() { # what a finished directory's .stamp must contain
  printf 'component=%s version=%s go=%s\n' "$1" "$2" "${go_version}"
}

# fresh <dir> <component> <version> <check-cmd...>: true when dir is complete and right.
fresh() {
  local dir="$1" comp="$2" ver="$3"
  shift 3
  [[ -f "${dir}/.stamp" ]] || return 1
  # The stamp records the Go toolchain too, but a newer Go does not invalidate a build.
  grep -q "^component=${comp} version=${ver} " "${dir}/.stamp" || return 1
  local check
  for check in "$@"; do
    # shellcheck disable=SC2086
    local out
    out="$(eval "${check}" 2>&1)" || return 1
    [[ "${out}" == *"${ver#v}"* ]] || { log "${check}: unexpected version output: ${out}"; return 1; }
  done
}

# install_dir <tmp> <final>: atomically publish a finished build.
publish() {
  local tmp="$1" final="$2" comp="$3" ver="$4"
  stamp_of "${comp}" "${ver}" >"${tmp}/.stamp"
  rm -rf "${final}.old"
  [[ -e "${final}" ]] && mv "${final}" "${final}.old"
  mv "${tmp}" "${final}"
  rm -rf "${final}.old"
}

declare -A TIMES=()
timed() { # timed <name> <function>
  local name="$1" start end
  start=$(date +%s)
  "$2"
  end=$(date +%s)
  TIMES["${name}"]=$((end - start))
  log "${name}: $((end - start))s"
}

# kube_wrapper_module <dir>: a go.mod that builds k8s.io/kubernetes ${KUBE_VERSION} from the proxy.
kube_wrapper_module() {
  local mod="$1"
  local ver="${KUBE_VERSION#v}"
  local minor_patch="${ver#*.}"
  mkdir -p "${mod}"
  "${GO}" mod download k8s.io/kubernetes@"${KUBE_VERSION}"
  local kmod
  kmod="$("${GO}" mod download -json k8s.io/kubernetes@"${KUBE_VERSION}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  [[ -f "${kmod}" ]] || die "could not download k8s.io/kubernetes@${KUBE_VERSION} from ${GOPROXY:-the Go module proxy}"
  # k8s.io/kubernetes requires its staging modules as v0.0.0 replaced by ./staging/...,
  # which a dependent module cannot see: replace each one with its published v0.MINOR.PATCH tag.
  {
    echo "// Generated by hack/build-testbin.sh: builds Kubernetes ${KUBE_VERSION} from the module proxy."
    echo "module torchjob.local/testbin/kubernetes"
    echo
    grep -E '^(go|godebug) ' "${kmod}"
    echo
    echo "require k8s.io/kubernetes ${KUBE_VERSION}"
    echo
    echo "replace ("
    sed -nE 's#^[[:space:]]*(k8s\.io/[^[:space:]]+) => \./staging/.*$#\t\1 => \1 v0.'"${minor_patch}"'#p' "${kmod}"
    echo ")"
  } >"${mod}/go.mod"
  [[ $(grep -c ' => k8s.io/' "${mod}/go.mod") -gt 20 ]] || die "found no staging replaces in ${kmod}; has k8s.io/kubernetes' layout changed?"
  rm -f "${mod}/go.sum"
}

# kube_ldflags: -X flags that make the binaries report ${KUBE_VERSION}.
kube_ldflags() {
  local ver="${KUBE_VERSION#v}"
  local major="${ver%%.*}" minor_patch="${ver#*.}"
  local minor="${minor_patch%%.*}"
  local ld="-s -w" key
  local -A vars=(
    [gitVersion]="${KUBE_VERSION}" [gitMajor]="${major}" [gitMinor]="${minor}"
    [gitTreeState]="clean" [gitCommit]="0000000000000000000000000000000000000000"
    [buildDate]="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  )
  for key in "${!vars[@]}"; do
    ld+=" -X k8s.io/component-base/version.${key}=${vars[${key}]}"
    ld+=" -X k8s.io/client-go/pkg/version.${key}=${vars[${key}]}"
  done
  echo "${ld}"
}

# ---------------------------------------------------------------- kubernetes
build_kubernetes() {
  local dir
  dir="$(component_dir kubernetes)"
  if fresh "${dir}" kubernetes "${KUBE_VERSION}" \
    "'${dir}/kube-apiserver' --version" \
    "'${dir}/kube-controller-manager' --version" \
    "'${dir}/kube-scheduler' --version" \
    "'${dir}/kubectl' version --client"; then
    log "kubernetes ${KUBE_VERSION}: up to date in ${dir}"
    # `make crds` and the CRD tests read the pod template schema from this module's OpenAPI
    # document: keep it in the Go module cache even when the binaries come from a cache
    # (a no-op when it is there already).
    "${GO}" mod download k8s.io/kubernetes@"${KUBE_VERSION}" ||
      die "could not download k8s.io/kubernetes@${KUBE_VERSION} (its OpenAPI document is needed by make crds)"
    return
  fi
  log "kubernetes ${KUBE_VERSION}: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (long on few cores)"
  local mod="${WORK}/kubernetes-${KUBE_VERSION}"
  kube_wrapper_module "${mod}"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  local ld
  ld="$(kube_ldflags)"
  # One invocation so the four commands share every compiled package.
  (cd "${mod}" && "${GO}" build -trimpath -ldflags "${ld}" -o "${tmp}/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler \
    k8s.io/kubernetes/cmd/kubectl)
  "${tmp}/kube-apiserver" --version | grep -q "${KUBE_VERSION}" || die "built kube-apiserver does not report ${KUBE_VERSION}"
  publish "${tmp}" "${dir}" kubernetes "${KUBE_VERSION}"
}

# ---------------------------------------------------------------- etcd
build_etcd() {
  local dir
  dir="$(component_dir etcd)"
  if fresh "${dir}" etcd "${ETCD_VERSION}" "'${dir}/etcd' --version"; then
    log "etcd ${ETCD_VERSION}: up to date in ${dir}"
    return
  fi
  log "etcd ${ETCD_VERSION}: building"
  # go.etcd.io/etcd/server/v3 has replace directives (to ../api etc.), so `go install pkg@v`
  # refuses it; a wrapper module that requires it works.
  local mod="${WORK}/etcd-${ETCD_VERSION}"
  mkdir -p "${mod}"
  printf '// Generated by hack/build-testbin.sh.\nmodule torchjob.local/testbin/etcd\n\ngo %s\n\nrequire go.etcd.io/etcd/server/v3 %s\n' \
    "${GO_MIN_VERSION}" "${ETCD_VERSION}" >"${mod}/go.mod"
  rm -f "${mod}/go.sum"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  (cd "${mod}" && "${GO}" build -trimpath -ldflags "-s -w" -o "${tmp}/etcd" go.etcd.io/etcd/server/v3)
  publish "${tmp}" "${dir}" etcd "${ETCD_VERSION}"
}

# ---------------------------------------------------------------- kwok, kwokctl
# kwok's pod controller deletes a pod it finished by name, where the kubelet deletes it by
# UID: a stage that ran late deleted the pod a controller had just made under the same name
# (the operator keeps its workers' names across generations; seen as a second generation in
# tests/cluster/test_node_notice.py). Built from the proxy's source with that one change;
# the suffix in its version marks the build (and makes an older one stale).
KWOK_PATCH="${HACK_DIR}/kwok/pod-delete-uid.patch"
KWOK_BUILD="${KWOK_VERSION}-torchjob.1"
build_kwok() {
  local dir
  dir="$(component_dir kwok)"
  if fresh "${dir}" kwok "${KWOK_BUILD}" "'${dir}/kwokctl' --version" "'${dir}/kwok' --version"; then
    log "kwok ${KWOK_BUILD}: up to date in ${dir}"
    return
  fi
  log "kwok ${KWOK_BUILD}: building kwok and kwokctl (${KWOK_PATCH##*/} applied)"
  local tmp="${dir}.tmp.$$" src
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  src="$("${GO}" mod download -json sigs.k8s.io/kwok@"${KWOK_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "${src}" ]] || die "kwok ${KWOK_VERSION}: 'go mod download' gave no source directory"
  cp -r "${src}" "${tmp}/src"
  chmod -R u+w "${tmp}/src"
  (cd "${tmp}/src" && GIT_CEILING_DIRECTORIES="${tmp}" git apply "${KWOK_PATCH}") || die "kwok: ${KWOK_PATCH} does not apply to ${KWOK_VERSION}"
  # kwok reports the version compiled into sigs.k8s.io/kwok/pkg/consts (set by its Makefile).
  local ld="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_BUILD#v}"
  (cd "${tmp}/src" && GOFLAGS=-mod=mod "${GO}" build -trimpath -ldflags "${ld}" -o "${tmp}/" ./cmd/kwok ./cmd/kwokctl)
  rm -rf "${tmp}/src"
  publish "${tmp}" "${dir}" kwok "${KWOK_BUILD}"
}

# ---------------------------------------------------------------- helm
build_helm() {
  local dir
  dir="$(component_dir helm)"
  if fresh "${dir}" helm "${HELM_VERSION}" "'${dir}/helm' version --short"; then
    log "helm ${HELM_VERSION}: up to date in ${dir}"
    return
  fi
  log "helm ${HELM_VERSION}: building"
  local tmp="${dir}.tmp.$$" major="${HELM_VERSION%%.*}"
  local pkg="helm.sh/helm/${major}"
  [[ "${major}" == "v2" || "${major}" == "v1" ]] && pkg="helm.sh/helm"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  GOBIN="${tmp}" "${GO}" install -trimpath \
    -ldflags "-s -w -X ${pkg}/internal/version.version=${HELM_VERSION}" \
    "${pkg}/cmd/helm@${HELM_VERSION}"
  publish "${tmp}" "${dir}" helm "${HELM_VERSION}"
}

# ---------------------------------------------------------------- krew (kubectl plugin manager)
build_krew() {
  local dir
  dir="$(component_dir krew)"
  # `krew version` would create its KREW_ROOT (~/.krew): read the module version from the
  # binary's build information instead.
  if fresh "${dir}" krew "${KREW_VERSION}" "'${GO}' version -m '${dir}/krew' | grep -E '^[[:space:]]+mod[[:space:]]'" \
    && [[ -x "${dir}/kubectl-krew" ]]; then
    log "krew ${KREW_VERSION}: up to date in ${dir}"
    return
  fi
  log "krew ${KREW_VERSION}: building"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  GOBIN="${tmp}" "${GO}" install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/krew/internal/version.gitTag=${KREW_VERSION}" \
    "sigs.k8s.io/krew/cmd/krew@${KREW_VERSION}"
  # kubectl runs `kubectl krew ...` as the executable kubectl-krew on the PATH (what krew's own
  # installer names it).
  ln -s krew "${tmp}/kubectl-krew"
  local check
  check="$(mktemp -d)"
  KREW_ROOT="${check}" KREW_NO_UPGRADE_CHECK=1 "${tmp}/krew" version 2>/dev/null | grep -q "${KREW_VERSION}" \
    || { rm -rf "${check}"; die "built krew does not report ${KREW_VERSION}"; }
  rm -rf "${check}"
  publish "${tmp}" "${dir}" krew "${KREW_VERSION}"
}

# ---------------------------------------------------------------- kubelet (real nodes, hack/node.sh)
build_kubelet() {
  local dir
  dir="$(component_dir kubelet)"
  if fresh "${dir}" kubelet "${KUBE_VERSION}" "'${dir}/kubelet' --version"; then
    log "kubelet ${KUBE_VERSION}: up to date in ${dir}"
    return
  fi
  log "kubelet ${KUBE_VERSION}: building (shares most packages with the control plane)"
  # Its own copy of the wrapper module, so that it never races a concurrent control-plane build.
  local mod="${WORK}/kubelet-${KUBE_VERSION}"
  kube_wrapper_module "${mod}"
  sed -i 's#^module .*#module torchjob.local/testbin/kubelet#' "${mod}/go.mod"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  local ld
  ld="$(kube_ldflags)"
  (cd "${mod}" && "${GO}" build -trimpath -ldflags "${ld}" -o "${tmp}/" k8s.io/kubernetes/cmd/kubelet)
  "${tmp}/kubelet" --version | grep -q "${KUBE_VERSION}" || die "built kubelet does not report ${KUBE_VERSION}"
  publish "${tmp}" "${dir}" kubelet "${KUBE_VERSION}"
}

# ---------------------------------------------------------------- CoreDNS (cluster DNS of real nodes)
build_coredns() {
  local dir
  dir="$(component_dir coredns)"
  if fresh "${dir}" coredns "${COREDNS_VERSION}" "'${dir}/coredns' -version"; then
    log "coredns ${COREDNS_VERSION}: up to date in ${dir}"
    return
  fi
  log "coredns ${COREDNS_VERSION}: building"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  GOBIN="${tmp}" "${GO}" install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@${COREDNS_VERSION}"
  publish "${tmp}" "${dir}" coredns "${COREDNS_VERSION}"
}

# ---------------------------------------------------------------- gitops-check (Argo CD Lua, kstatus)
build_gitops() {
  local dir src="${HACK_DIR}/gitops-check" sum
  dir="$(component_dir gitops)"
  # Its source lives in this repository: the stamp's version carries a hash of it.
  sum="$(cat "${src}/go.mod" "${src}/go.sum" "${src}"/*.go | sha256sum | cut -c1-12)"
  if fresh "${dir}" gitops "${GOPHER_LUA_VERSION}-${CLI_UTILS_VERSION}-${sum}"; then
    log "gitops-check: up to date in ${dir}"
    return
  fi
  grep -q "github.com/yuin/gopher-lua ${GOPHER_LUA_VERSION}\$" "${src}/go.mod" \
    && grep -q "sigs.k8s.io/cli-utils ${CLI_UTILS_VERSION}\$" "${src}/go.mod" \
    || die "hack/gitops-check/go.mod does not pin gopher-lua ${GOPHER_LUA_VERSION} and cli-utils ${CLI_UTILS_VERSION} (hack/versions.env)"
  log "gitops-check (gopher-lua ${GOPHER_LUA_VERSION}, kstatus ${CLI_UTILS_VERSION}): building"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  (cd "${src}" && GOFLAGS="-mod=readonly -buildvcs=false" "${GO}" build -trimpath -ldflags "-s -w" -o "${tmp}/gitops-check" .)
  publish "${tmp}" "${dir}" gitops "${GOPHER_LUA_VERSION}-${CLI_UTILS_VERSION}-${sum}"
}

# ---------------------------------------------------------------- PodGroup CRDs (gang scheduling tests)
build_podgroup-crds() {
  local dir mod
  dir="$(component_dir podgroup-crds)"
  if fresh "${dir}" podgroup-crds "${SCHEDULER_PLUGINS_VERSION}"; then
    log "podgroup-crds ${SCHEDULER_PLUGINS_VERSION}: up to date in ${dir}"
    return
  fi
  log "podgroup-crds: scheduler-plugins ${SCHEDULER_PLUGINS_VERSION} from the module proxy"
  mod="$("${GO}" mod download -json "sigs.k8s.io/scheduler-plugins@${SCHEDULER_PLUGINS_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -f "${mod}/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" ]] \
    || die "sigs.k8s.io/scheduler-plugins@${SCHEDULER_PLUGINS_VERSION} has no config/crd/bases/scheduling.x-k8s.io_podgroups.yaml"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  cp "${mod}/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "${tmp}/"
  publish "${tmp}" "${dir}" podgroup-crds "${SCHEDULER_PLUGINS_VERSION}"
}

# ---------------------------------------------------------------- monitoring.coreos.com CRDs
# ServiceMonitor and PrometheusRule, so the chart installs with every switch on (tests only).
build_monitoring-crds() {
  local dir mod base f
  dir="$(component_dir monitoring-crds)"
  if fresh "${dir}" monitoring-crds "${PROMETHEUS_OPERATOR_VERSION}"; then
    log "monitoring-crds ${PROMETHEUS_OPERATOR_VERSION}: up to date in ${dir}"
    return
  fi
  log "monitoring-crds: prometheus-operator ${PROMETHEUS_OPERATOR_VERSION} from the module proxy"
  mod="$("${GO}" mod download -json "github.com/prometheus-operator/prometheus-operator@${PROMETHEUS_OPERATOR_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  base="${mod}/example/prometheus-operator-crd"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  for f in monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_prometheusrules.yaml; do
    [[ -f "${base}/${f}" ]] || die "prometheus-operator@${PROMETHEUS_OPERATOR_VERSION} has no example/prometheus-operator-crd/${f}"
    cp "${base}/${f}" "${tmp}/"
  done
  publish "${tmp}" "${dir}" monitoring-crds "${PROMETHEUS_OPERATOR_VERSION}"
}

mkdir -p "${ROOT}" "${WORK}"
# One build at a time per root: a second `make testbin` waits, then finds everything fresh.
if command -v flock >/dev/null 2>&1; then
  exec 9>"${ROOT}/.build.lock"
  flock -n 9 || { log "another build-testbin.sh is running; waiting for it"; flock 9; }
fi
total_start=$(date +%s)
log "Go ${go_version}; GOPROXY=$("${GO}" env GOPROXY); testbin root ${ROOT}"
# ---------------------------------------------------------------- kueue
build_kueue() {
  local dir
  dir="$(component_dir kueue)"
  if fresh "${dir}" kueue "${KUEUE_VERSION}"; then
    log "kueue ${KUEUE_VERSION}: up to date in ${dir}"
    return
  fi
  log "kueue ${KUEUE_VERSION}: building cmd/kueue from the module proxy (a few minutes cold)"
  local mod
  mod="$("${GO}" mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "${mod}" && -d "${mod}/cmd/kueue" ]] || die "sigs.k8s.io/kueue@${KUEUE_VERSION}: no cmd/kueue in the module"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}/crds"
  # Its own go.mod and go.sum, read-only in the module cache: exactly the release's dependencies.
  (cd "${mod}" && GOFLAGS="-mod=readonly -buildvcs=false" "${GO}" build -trimpath -ldflags "-s -w" -o "${tmp}/kueue" ./cmd/kueue)
  cp "${mod}"/config/components/crd/bases/*.yaml "${tmp}/crds/"
  cp "${mod}/config/components/webhook/manifests.yaml" "${tmp}/webhooks.yaml"
  publish "${tmp}" "${dir}" kueue "${KUEUE_VERSION}"
}

# ---------------------------------------------------------------- SeaweedFS (S3-compatible object store)
build_seaweedfs() {
  local dir commit
  dir="$(component_dir seaweedfs)"
  # SeaweedFS tags are not semver ("4.01"), so the module proxy serves pseudo-versions only;
  # `weed version` prints the commit that -X below compiles in.
  commit="${SEAWEEDFS_VERSION##*-}"
  if fresh "${dir}" seaweedfs "${SEAWEEDFS_VERSION}" && "${dir}/weed" version 2>&1 | grep -q "${commit:0:8}"; then
    log "seaweedfs ${SEAWEEDFS_VERSION}: up to date in ${dir}"
    return
  fi
  log "seaweedfs ${SEAWEEDFS_VERSION}: building the weed binary from the module proxy (minutes cold)"
  local mod
  mod="$("${GO}" mod download -json "github.com/seaweedfs/seaweedfs@${SEAWEEDFS_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -n "${mod}" && -d "${mod}/weed" ]] || die "github.com/seaweedfs/seaweedfs@${SEAWEEDFS_VERSION}: no weed/ in the module"
  local tmp="${dir}.tmp.$$"
  rm -rf "${tmp}"
  mkdir -p "${tmp}"
  # Its go.mod has a replace directive, so `go install pkg@version` refuses it: build inside the
  # (read-only) module with exactly the release's go.mod and go.sum.
  (cd "${mod}" && GOFLAGS="-mod=readonly -buildvcs=false" "${GO}" build -trimpath \
    -ldflags "-s -w -X github.com/seaweedfs/seaweedfs/weed/util/version.COMMIT=${commit:0:8}" \
    -o "${tmp}/weed" ./weed)
  "${tmp}/weed" version 2>&1 | grep -q "${commit:0:8}" || die "built weed does not report commit ${commit:0:8}"
  publish "${tmp}" "${dir}" seaweedfs "${SEAWEEDFS_VERSION}"
}

components=("${@}")
[[ ${#components[@]} -gt 0 ]] || components=(kwok etcd kubernetes helm krew kubelet coredns gitops podgroup-crds monitoring-crds kueue seaweedfs)
# SeaweedFS needs ~2 GB of modules: download them in the background while the other components
# compile (CPU-bound), so a cold build pays the network and the compiler at the same time.
prefetch_pid=""
if [[ " ${components[*]} " == *" seaweedfs "* ]] && ! fresh "$(component_dir seaweedfs)" seaweedfs "${SEAWEEDFS_VERSION}"; then
  (
    mod="$("${GO}" mod download -json "github.com/seaweedfs/seaweedfs@${SEAWEEDFS_VERSION}" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [[ -n "${mod}" ]] && cd "${mod}" && GOFLAGS="-mod=readonly" "${GO}" mod download >/dev/null 2>&1
  ) &
  prefetch_pid=$!
fi
for c in "${components[@]}"; do
  case "${c}" in
    seaweedfs)
      [[ -z "${prefetch_pid}" ]] || wait "${prefetch_pid}" || true
      timed "${c}" "build_${c}"
      ;;
    kubernetes | etcd | kwok | helm | krew | kubelet | coredns | gitops | podgroup-crds | monitoring-crds | kueue) timed "${c}" "build_${c}" ;;
    *) die "unknown component '${c}' (kubernetes|etcd|kwok|helm|krew|kubelet|coredns|gitops|podgroup-crds|monitoring-crds|kueue|seaweedfs)" ;;
  esac
done
log "total: $(($(date +%s) - total_start))s"
for c in "${components[@]}"; do
  printf '  %-11s %4ss  %s\n' "${c}" "${TIMES[${c}]}" "$(component_dir "${c}")" >&2
done
