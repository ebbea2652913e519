#!/usr/bin/env bash
# Build the container images with docker or podman (whichever works), all tagged from one
# version source: pyproject.toml's `version`.
#
#   hack/images.sh build [IMAGE...]   build (or reuse) images; IMAGE: operator runtime runtime-cpu pause
#                                     (default: operator runtime-cpu pause, what the tests run)
#   hack/images.sh save IMAGE         print the path of a docker-archive tar of IMAGE (cached)
#   hack/images.sh ref IMAGE          print IMAGE's reference, e.g. localhost/torchjob/operator:0.1.0
#   hack/images.sh push [IMAGE...]    push to $IMAGE_REPO (set it, e.g. IMAGE_REPO=ghcr.io/me)
#
# Environment:
#   IMAGE_REPO      repository prefix (default localhost/torchjob)
#   CONTAINER_ENGINE  docker|podman (default: docker when its daemon answers, else podman)
#   TORCHJOB_BASE   registry|local|auto (default auto): the public bases (python:3.11-slim,
#                   PyTorch's CUDA image) or local Debian bases built with mmdebstrap. auto
#                   uses the registry when it answers.
#   TORCHJOB_IMAGE_CACHE  where saved tars and base rootfs live (default ~/.cache/torchjob/images)
#
# runtime-cpu, the image the real-node tests run, is always built on a local Debian base whose
# torch is Debian's CPU build (python3-torch from Debian trixie): PyPI only has CUDA wheels of
# torch for x86-64 (several GB with their nvidia-* dependencies).
# An image is rebuilt only when its inputs change (a content hash in its label).
set -euo pipefail
shopt -s inherit_errexit
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HACK_DIR}/.." && pwd)"
CACHE="${TORCHJOB_IMAGE_CACHE:-${HOME}/.cache/torchjob/images}"
IMAGE_REPO="${IMAGE_REPO:-localhost/torchjob}"
BASE_MODE="${TORCHJOB_BASE:-auto}"
VERSION="$(sed -nE 's/^version = "([^"]+)"$/\1/p' "${REPO}/pyproject.toml" | head -1)"
LABEL=io.torchjob.inputs

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }
[[ -n "${VERSION}" ]] || die "no version in pyproject.toml"

engine() {
  if [[ -n "${CONTAINER_ENGINE:-}" ]]; then
    echo "${CONTAINER_ENGINE}"
  elif command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null 2>&1; then
    echo podman
  else
    return 1
  fi
}
ENGINE="$(engine)" || die "neither a working docker (daemon answering 'docker info') nor podman found; install one (Debian: apt-get install podman)"

# podman inside this kind of VM cannot raise RLIMIT_NPROC/NOFILE to its defaults (no
# CAP_SYS_RESOURCE): lower limits work. --network host: a build never creates a bridge or
# NAT rules on the machine.
BUILD_ARGS=()
if [[ "${ENGINE}" == podman ]]; then
  BUILD_ARGS+=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096 --network host)
fi
# Builds that download (pip) go through whatever TLS proxy the host trusts: hand its CA bundle in.
HOST_CA=""
for f in "${PIP_CERT:-}" /etc/ssl/certs/ca-certificates.crt; do
  [[ -n "${f}" && -f "${f}" ]] && { HOST_CA="${f}"; break; }
done
if [[ -n "${HOST_CA}" && "${ENGINE}" == podman ]]; then
  BUILD_ARGS+=(-v "${HOST_CA}:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
fi

ref() {
  case "$1" in
    operator) echo "${IMAGE_REPO}/operator:${VERSION}" ;;
    runtime) echo "${IMAGE_REPO}/runtime:${VERSION}" ;;
    runtime-cpu) echo "${IMAGE_REPO}/runtime:${VERSION}-cpu" ;;
    pause) echo "${IMAGE_REPO}/pause:${VERSION}" ;;
    *) die "unknown image '$1' (operator|runtime|runtime-cpu|pause)" ;;
  esac
}

exists() { "${ENGINE}" image inspect "$1" >/dev/null 2>&1; }
label_of() { "${ENGINE}" image inspect --format "{{ index .Config.Labels \"${LABEL}\" }}" "$1" 2>/dev/null || true; }

inputs_hash() { # inputs_hash <path...>: content hash of the files under the given repo paths
  (cd "${REPO}" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z |
    xargs -0 sha256sum) | sha256sum | cut -c1-16
}

registry_answers() {
  [[ "${BASE_MODE}" == registry ]] && return 0
  [[ "${BASE_MODE}" == local ]] && return 1
  exists "$1" && return 0
  log "checking whether a registry answers for $1 ..."
  timeout 60 "${ENGINE}" pull -q "$1" >/dev/null 2>&1
}

# ---------------------------------------------------------------- local Debian bases
# debian_base <tag> <suite> <packages>: a minbase rootfs made with mmdebstrap, imported.
debian_base() {
  local tag="$1" suite="$2" packages="$3"
  local key
  key="$(printf '%s %s %s' "${suite}" "${packages}" 1 | sha256sum | cut -c1-12)"
  if exists "${tag}" && [[ "$(label_of "${tag}")" == "${key}" ]]; then
    return
  fi
  command -v mmdebstrap >/dev/null 2>&1 || die "no registry answers and mmdebstrap is missing to build a local base (apt-get install mmdebstrap)"
  mkdir -p "${CACHE}"
  local tar="${CACHE}/rootfs-${suite}-${key}.tar" start=${SECONDS}
  if [[ ! -s "${tar}" ]]; then
    log "building base ${tag} with mmdebstrap (${suite}: ${packages})"
    mmdebstrap --quiet --format=tar --variant=minbase --include="${packages}" --aptopt='APT::Install-Recommends "false"' \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      "${suite}" "${tar}.tmp" >&2 || die "mmdebstrap ${suite} failed"
    mv "${tar}.tmp" "${tar}"
  fi
  "${ENGINE}" import --change "LABEL ${LABEL}=${key}" --change 'CMD ["/bin/bash"]' "${tar}" "${tag}" >/dev/null
  log "base ${tag}: $((SECONDS - start))s"
}

operator_base() {
  if registry_answers python:3.11-slim; then
    echo python:3.11-slim
  else
    debian_base "${IMAGE_REPO}/debian-python:bookworm" bookworm "python3,python3-venv,ca-certificates"
    echo "${IMAGE_REPO}/debian-python:bookworm"
  fi
}

cpu_torch_base() {
  debian_base "${IMAGE_REPO}/debian-torch:trixie" trixie \
    "python3,python3-venv,python3-torch,python3-numpy,ca-certificates"
  echo "${IMAGE_REPO}/debian-torch:trixie"
}

# ---------------------------------------------------------------- images
# build_one <image> <dockerfile> <context> <base> <hash> [--build-arg K=V...]
build_one() {
  local image="$1" dockerfile="$2" context="$3" base="$4" hash="$5" tag
  shift 5
  tag="$(ref "${image}")"
  if exists "${tag}" && [[ "$(label_of "${tag}")" == "${hash}" ]]; then
    log "${tag}: up to date"
    return
  fi
  local start=${SECONDS} old=""
  exists "${tag}" && old="$("${ENGINE}" image inspect --format '{{.Id}}' "${tag}")"
  log "${tag}: building with ${ENGINE} (BASE=${base})"
  "${ENGINE}" build --pull=never "${BUILD_ARGS[@]}" "$@" --build-arg "BASE=${base}" --label "${LABEL}=${hash}" \
    -f "${dockerfile}" -t "${tag}" "${context}" >&2
  log "${tag}: built in $((SECONDS - start))s, $(size_of "${tag}")"
  # The image this one replaced (now untagged); its layers shared with the new one stay.
  if [[ -n "${old}" && "${old}" != "$("${ENGINE}" image inspect --format '{{.Id}}' "${tag}")" ]]; then
    "${ENGINE}" rmi "${old}" >/dev/null 2>&1 || true
  fi
}

base_id() { # a short id of a base image (a rebuilt local base rebuilds what is built on it)
  local id
  id="$("${ENGINE}" image inspect --format '{{.Id}}' "$1" 2>/dev/null || printf %s "$1" | sha256sum)"
  id="${id#sha256:}"
  echo "${id:0:12}"
}

size_of() { "${ENGINE}" image inspect --format '{{.Size}}' "$1" | awk '{printf "%.0f MB", $1 / 1e6}'; }

build_image() {
  local image="$1" base hash
  case "${image}" in
    operator)
      base="$(operator_base)"
      hash="$(inputs_hash pyproject.toml runtime operator images/operator images/venv.sh)-$(base_id "${base}")"
      build_one operator "${REPO}/images/operator/Dockerfile" "${REPO}" "${base}" "${hash}"
      ;;
    runtime)
      base="pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
      registry_answers "${base}" || die "the runtime (CUDA) image needs ${base} from a registry, and none answers; 'runtime-cpu' builds without one"
      hash="$(inputs_hash pyproject.toml runtime operator images/runtime images/venv.sh)"
      build_one runtime "${REPO}/images/runtime/Dockerfile" "${REPO}" "${base}" "${hash}"
      ;;
    runtime-cpu)
      base="$(cpu_torch_base)"
      hash="$(inputs_hash pyproject.toml runtime operator images/runtime images/venv.sh)-cpu-$(base_id "${base}")"
      # Debian's torch is built without libuv, the default of torch's TCPStore since 2.4:
      # USE_LIBUV=0 makes init_process_group("env://") use the classic store.
      build_one runtime-cpu "${REPO}/images/runtime/Dockerfile" "${REPO}" "${base}" "${hash}" \
        --build-arg USE_LIBUV=0
      ;;
    pause)
      hash="$(inputs_hash images/pause)"
      local tag ctx
      tag="$(ref pause)"
      if exists "${tag}" && [[ "$(label_of "${tag}")" == "${hash}" ]]; then
        log "${tag}: up to date"
        return
      fi
      ctx="$(mktemp -d)"
      cp "${REPO}/images/pause/Dockerfile" "${ctx}/"
      local go="go"
      command -v go >/dev/null 2>&1 || go=/usr/local/go/bin/go
      (cd "${REPO}/images/pause" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS= GO111MODULE=off \
        "${go}" build -trimpath -ldflags "-s -w" -o "${ctx}/pause" pause.go)
      build_one pause "${ctx}/Dockerfile" "${ctx}" scratch "${hash}"
      rm -rf "${ctx}"
      ;;
    *) die "unknown image '${image}'" ;;
  esac
}

# save <image>: a docker-archive of the current image, cached by image id. Two callers at once
# (make test's e2e and faults sessions each start their real nodes) take turns on a lock per
# image: the second finds the first's archive. Without it, one removed the other's .tmp
# before its rename.
save() {
  local tag id tar lock
  tag="$(ref "$1")"
  exists "${tag}" || build_image "$1"
  id="$("${ENGINE}" image inspect --format '{{.Id}}' "${tag}")"
  id="${id#sha256:}"
  mkdir -p "${CACHE}"
  tar="${CACHE}/$1-${id:0:16}.tar"
  exec {lock}>"${CACHE}/$1.lock"
  flock "${lock}"
  if [[ ! -s "${tar}" ]]; then
    # A save interrupted before its rename leaves a .tmp that podman refuses to write over.
    rm -f "${CACHE}/$1-"*.tar "${tar}.tmp"
    "${ENGINE}" save -o "${tar}.tmp" "${tag}" >/dev/null
    mv "${tar}.tmp" "${tar}"
  fi
  exec {lock}>&-
  echo "${tar}"
}

cmd="${1:-build}"
shift || true
case "${cmd}" in
  build)
    images=("$@")
    [[ ${#images[@]} -gt 0 ]] || images=(operator runtime-cpu pause)
    # One build at a time (make test's two real-node sessions each ask for the images): the
    # second waits, then finds them up to date instead of building them again beside it.
    mkdir -p "${CACHE}"
    exec {build_lock}>"${CACHE}/build.lock"
    flock "${build_lock}"
    total=${SECONDS}
    for i in "${images[@]}"; do build_image "${i}"; done
    log "done in $((SECONDS - total))s (${ENGINE}): $(for i in "${images[@]}"; do printf '%s ' "$(ref "${i}")"; done)"
    ;;
  save) save "${1:?image}" ;;
  ref) ref "${1:?image}" ;;
  push)
    [[ "${IMAGE_REPO}" != localhost/* ]] || die "set IMAGE_REPO to your registry, e.g. IMAGE_REPO=ghcr.io/me hack/images.sh push"
    images=("$@")
    [[ ${#images[@]} -gt 0 ]] || images=(operator runtime)
    for i in "${images[@]}"; do
      build_image "${i}"
      "${ENGINE}" push "$(ref "${i}")"
    done
    ;;
  *)
    echo "usage: $0 build|save|ref|push [IMAGE...]" >&2
    exit 2
    ;;
esac
