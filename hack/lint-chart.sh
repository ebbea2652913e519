#!/usr/bin/env bash
# Lint the Helm chart as it is installed: `helm lint`, then checkov (hack/versions.env pins it,
# `uv tool run` installs it into uv's cache once) on the chart rendered with every optional
# part on (replicaCount 2 -> PodDisruptionBudget, networkPolicy.enabled, image.digest), so every
# template is checked. Findings are fixed in the chart or waived in hack/checkov.yaml, with the
# reason, and nowhere else. Needs helm (hack/build-testbin.sh helm builds or reuses it).
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "${HACK_DIR}")"
# shellcheck source=versions.env
source "${HACK_DIR}/versions.env"
CHART="${REPO}/charts/torchjob-operator"
UV="${UV:-${REPO}/.venv/bin/uv}"
command -v "${UV}" >/dev/null 2>&1 || UV=uv

HELM_DIR="$("${HACK_DIR}/build-testbin.sh" --print-dir helm)"
[[ -x "${HELM_DIR}/helm" ]] || "${HACK_DIR}/build-testbin.sh" helm >&2
HELM="${HELM_DIR}/helm"

OUT="$(mktemp -d -t torchjob-chart-lint.XXXXXX)"
trap 'rm -rf "${OUT}"' EXIT

"${HELM}" lint --strict "${CHART}"
"${HELM}" template torchjob "${CHART}" --namespace torchjob-system \
  --set replicaCount=2 \
  --set networkPolicy.enabled=true \
  --set 'networkPolicy.apiServer.cidrs[0]=10.0.0.1/32' \
  --set image.digest=sha256:0000000000000000000000000000000000000000000000000000000000000000 \
  --set dashboard.enabled=true --set metrics.prometheusRule.enabled=true \
  --set metrics.grafanaDashboard.enabled=true --set metrics.serviceMonitor.enabled=true \
  >"${OUT}/chart.yaml"

BC_SKIP_MAPPING=TRUE "${UV}" tool run --quiet --from "checkov==${CHECKOV_VERSION}" checkov \
  --config-file "${HACK_DIR}/checkov.yaml" --file "${OUT}/chart.yaml"
