#!/usr/bin/env bash
# `make cluster-demo`: the local cluster, the CRD, the operator, and an example job.
# Shows what a person reads: kubectl get tj,pods and kubectl describe tj.
# The operator keeps running in the background (log and pid under the cluster's cache dir);
# `make cluster-down` stops it with the cluster.
set -euo pipefail
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HACK_DIR}/.." && pwd)"
PY="${REPO}/.venv/bin/python"
source "${HACK_DIR}/versions.env"
ROOT="${TORCHJOB_TESTBIN_ROOT:-${HOME}/.cache/torchjob/testbin}"
KUBECTL="${ROOT}/kubernetes-${KUBE_VERSION}/kubectl"
export KUBECONFIG="$("${HACK_DIR}/cluster.sh" kubeconfig)"
STATE="$(dirname "${KUBECONFIG}")"
k() { "${KUBECTL}" "$@"; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "installing the TorchJob CRD (generated from torchjob.api)"
k apply --server-side --force-conflicts -f "${REPO}/crds/torchjob.io_torchjobs.yaml"
k apply --server-side --force-conflicts -f "${REPO}/crds/torchjob.io_torchtunes.yaml"
# Not `kubectl wait` alone: it fails at once while the new CRD has no status yet.
for _ in $(seq 120); do
  [[ "$(k get crd/torchjobs.torchjob.io -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null)" == True ]] && break
  sleep 0.5
done
k wait --for=condition=Established crd/torchjobs.torchjob.io --timeout=60s

say "starting the operator (log: ${STATE}/operator.log)"
if [[ -f "${STATE}/operator.pid" ]] && kill -0 "$(cat "${STATE}/operator.pid")" 2>/dev/null; then
  echo "operator already running (pid $(cat "${STATE}/operator.pid"))"
else
  nohup "${PY}" -m torchjob_operator --kubeconfig "${KUBECONFIG}" >"${STATE}/operator.log" 2>&1 &
  echo $! >"${STATE}/operator.pid"
fi

say "kubectl apply -f examples/cpu-smoke.yaml"
k delete tj cpu-smoke --ignore-not-found --wait=true >/dev/null
sed 's/terminationGracePeriodSeconds: 5/terminationGracePeriodSeconds: 0/' "${REPO}/examples/cpu-smoke.yaml" | k apply -f -
k wait --for=condition=Running tj/cpu-smoke --timeout=90s
say "kubectl get tj,pods -o wide"
k get tj,pods -o wide

say "worker 1 crashes with exit code 1 (a kwok Stage plays the container): the group restarts"
# The message is what the torchjob runtime writes to the termination log; describe quotes it.
k annotate pod cpu-smoke-worker-1 kwok.torchjob.io/exit-code=1 \
  "kwok.torchjob.io/exit-message=torchjob: rank 1 raised ValueError: loss is NaN at step 812" \
  --overwrite >/dev/null
k wait --for=jsonpath='{.status.restarts}'=1 tj/cpu-smoke --timeout=60s
k wait --for=condition=Running tj/cpu-smoke --timeout=90s
k get tj cpu-smoke

say "both workers finish with exit code 0"
for p in $(k get pods -l torchjob.io/job-name=cpu-smoke -o name); do
  k annotate "$p" kwok.torchjob.io/exit-code=0 --overwrite >/dev/null
done
k wait --for=condition=Succeeded tj/cpu-smoke --timeout=60s
k get tj,pods
say "kubectl describe tj cpu-smoke"
k describe tj cpu-smoke
echo
echo "export KUBECONFIG=${KUBECONFIG}   # to look around; make cluster-down removes everything"
