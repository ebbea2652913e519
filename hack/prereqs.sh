#!/usr/bin/env bash
# The Debian packages the suite runs besides what Python and Go bring: the real node's
# (containerd, runc, CNI plugins, iptables, iproute2; podman and mmdebstrap build the
# images), Prometheus (tests/cluster/test_prometheus.py) and Chromium with its driver
# (tests/cluster/test_dashboard.py), procps (hack/test.sh records the load with vmstat and
# ps). `make test` and .ci/run call it: as root with apt-get,
# what is missing is installed; otherwise it says what to install and the tests that need a
# package skip saying so (under CI=true they fail).
set -euo pipefail
PKGS=(procps podman mmdebstrap containerd runc containernetworking-plugins iptables iproute2 prometheus chromium chromium-driver)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "${p}" >/dev/null 2>&1 || missing+=("${p}"); done
[[ ${#missing[@]} -eq 0 ]] && exit 0
if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  echo "[prereqs] installing from Debian: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o DPkg::Lock::Timeout=300 "${missing[@]}" >/dev/null
else
  echo "[prereqs] not installed (the tests that need them skip): apt-get install ${missing[*]}" >&2
fi
