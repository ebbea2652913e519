#!/usr/bin/env bash
# The real-container e2e tests (tests/cluster/test_real_node.py) on a kind cluster instead of
# hack/node.sh's real node: `make e2e-kind`. It builds the images (hack/images.sh, with
# Docker), `kind load`s them, labels and taints the kind worker as the tests' real node, and
# runs the same tests, which install the chart with the operator image.
# Needs a working Docker daemon and `kind` on PATH. Without them it SKIPS (exit 0) and says
# so: nothing here ever reports a pass it did not earn. It has not been run on the machines
# this project is developed on (no Docker daemon there); `make test` runs the same tests on
# hack/node.sh's kubelet + containerd node.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
NAME="${TORCHJOB_KIND_CLUSTER:-torchjob-e2e}"

skip() {
  echo "e2e-kind: SKIPPED: $*" >&2
  echo "e2e-kind: install Docker and kind (https://kind.sigs.k8s.io) to run it; 'make test' runs the same tests on a local kubelet + containerd node." >&2
  exit 0
}

command -v docker >/dev/null 2>&1 || skip "docker is not installed"
docker info >/dev/null 2>&1 || skip "the Docker daemon is not reachable ('docker info' failed)"
command -v kind >/dev/null 2>&1 || skip "kind is not installed"

PY="${REPO}/.venv/bin/python"
[[ -x "${PY}" ]] || { echo "e2e-kind: run 'make venv' first" >&2; exit 1; }
# kubectl and helm of the pinned versions (the tests call them).
"${HACK_DIR}/build-testbin.sh" kubernetes helm

CONTAINER_ENGINE=docker "${HACK_DIR}/images.sh" build operator runtime-cpu

KUBECONFIG_PATH="$(mktemp -t torchjob-kind-kubeconfig.XXXXXX)"
CONFIG="$(mktemp -t torchjob-kind-config.XXXXXX)"
cleanup() { kind delete cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" >/dev/null 2>&1 || true; rm -f "${KUBECONFIG_PATH}" "${CONFIG}"; }
trap cleanup EXIT

# The tests mount their scripts (this checkout) and checkpoint directories (pytest's, under
# the temp dir) by hostPath: the kind node sees both at the same paths.
TMP_ROOT="$(dirname "$(mktemp -u)")"
cat >"${CONFIG}" <<YAML
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
  - role: worker
    extraMounts:
      - {hostPath: "${REPO}", containerPath: "${REPO}", readOnly: true}
      - {hostPath: "${TMP_ROOT}", containerPath: "${TMP_ROOT}"}
YAML
image_args=()
[[ -n "${KIND_NODE_IMAGE:-}" ]] && image_args=(--image "${KIND_NODE_IMAGE}")
kind create cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" --config "${CONFIG}" --wait 120s "${image_args[@]}"
for i in operator runtime-cpu; do
  kind load docker-image --name "${NAME}" "$("${HACK_DIR}/images.sh" ref "${i}")"
done
KUBECTL="$("${HACK_DIR}/build-testbin.sh" --print-dir kubernetes)/kubectl"
WORKER="${NAME}-worker"
"${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" label node "${WORKER}" torchjob.io/real-node=true --overwrite
"${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" taint node "${WORKER}" torchjob.io/real-node=true:NoSchedule --overwrite
export TORCHJOB_E2E_KIND_KUBECONFIG="${KUBECONFIG_PATH}" TORCHJOB_E2E_KIND_NODE="${WORKER}"
"${PY}" -m pytest "${REPO}/tests/cluster/test_real_node.py" "$@"
