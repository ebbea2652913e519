#!/usr/bin/env bash
# End-to-end tests on a kind cluster (real kubelets in Docker): `make e2e-kind`.
# Needs a working Docker daemon and `kind` on PATH. Without them it SKIPS (exit 0) and says
# so: nothing here ever reports a pass it did not earn. The everyday suite uses the kwokctl
# control plane instead (`make test`, hack/cluster.sh).
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HACK_DIR}/.." && pwd)"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
NAME="${TORCHJOB_KIND_CLUSTER:-torchjob-e2e}"

skip() {
  echo "e2e-kind: SKIPPED: $*" >&2
  echo "e2e-kind: install Docker and kind (https://kind.sigs.k8s.io) to run it; 'make test' covers the control plane with kwokctl." >&2
  exit 0
}

command -v docker >/dev/null 2>&1 || skip "docker is not installed"
docker info >/dev/null 2>&1 || skip "the Docker daemon is not reachable ('docker info' failed)"
command -v kind >/dev/null 2>&1 || skip "kind is not installed"

PY="${REPO}/.venv/bin/python"
[[ -x "${PY}" ]] || { echo "e2e-kind: run 'make venv' first" >&2; exit 1; }

KUBECONFIG_PATH="$(mktemp -t torchjob-kind-kubeconfig.XXXXXX)"
cleanup() { kind delete cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" >/dev/null 2>&1 || true; rm -f "${KUBECONFIG_PATH}"; }
trap cleanup EXIT

# kind publishes node images per Kubernetes release; KIND_NODE_IMAGE overrides the choice.
image_args=()
[[ -n "${KIND_NODE_IMAGE:-}" ]] && image_args=(--image "${KIND_NODE_IMAGE}")
kind create cluster --name "${NAME}" --kubeconfig "${KUBECONFIG_PATH}" --wait 120s "${image_args[@]}"
export KUBECONFIG="${KUBECONFIG_PATH}" TORCHJOB_E2E_KIND=1
"${PY}" -m pytest "${REPO}/tests/e2e" -m e2e "$@"
