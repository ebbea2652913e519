#!/usr/bin/env bash
# Build the kubectl plugin (`kubectl torchjob ...`) as a krew plugin, into dist/ (git-ignored):
#
#   dist/kubectl-torchjob_linux_amd64.tar.gz   the launcher hack/kubectl-torchjob, LICENSE and
#                                              one zipapp per CPython minor version
#                                              (kubectl-torchjob-py3.10.pyz ... -py3.13.pyz)
#   dist/krew/torchjob.yaml                    the krew manifest, with that archive's sha256
#
# Each zipapp (shiv) is the torchjob CLI with its dependencies: this repository's wheel (the
# CLI imports no torch) and the kubernetes client, installed for manylinux x86_64 and that
# CPython version from wheels only (pydantic-core, PyYAML, aiohttp are compiled per version).
# The zipapp for the venv's own Python version gets exactly the venv's versions (its
# `uv pip freeze` as constraints), so it runs what the tests run; the other versions resolve
# to the newest wheels that support them (the venv's may not: e.g. a dependency of the
# kubernetes client that needs Python >= 3.11). Entry point: torchjob.cli.main:kubectl_main,
# the same code as the `torchjob` CLI.
#
# Install it with krew (tests/cluster/test_kubectl_plugin.py does exactly this):
#   kubectl krew install --manifest=dist/krew/torchjob.yaml \
#     --archive=dist/kubectl-torchjob_linux_amd64.tar.gz
#
# Needs the venv (`make venv`: uv and shiv) and PyPI or uv's cache. Environment:
#   DIST (default dist), PYTHON_VERSIONS (default "3.10 3.11 3.12 3.13"), PY (the venv python).
# The archive is reproducible for a given commit and set of wheels: sorted entries, the
# commit's time as every mtime (SOURCE_DATE_EPOCH), no gzip timestamp.
set -euo pipefail

HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "${HACK_DIR}")"
cd "${REPO}"
DIST="${DIST:-${REPO}/dist}"
PY="${PY:-${REPO}/.venv/bin/python}"
VENV_BIN="$(dirname "${PY}")"
PYTHON_VERSIONS="${PYTHON_VERSIONS:-3.10 3.11 3.12 3.13}"
HOMEPAGE="https://github.com/torchjob/torchjob"
ARCHIVE_NAME="kubectl-torchjob_linux_amd64.tar.gz"

log() { printf '[kubectl-plugin] %s\n' "$*" >&2; }
die() { printf '[kubectl-plugin] error: %s\n' "$*" >&2; exit 1; }

for tool in uv shiv; do
  [[ -x "${VENV_BIN}/${tool}" ]] || die "${VENV_BIN}/${tool} not found: run 'make venv' (shiv is in the dev extra of pyproject.toml)"
done
UV="${VENV_BIN}/uv"
SHIV="${VENV_BIN}/shiv"
[[ -f LICENSE ]] || die "no LICENSE at the repository root"

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
[[ "${VERSION}" =~ ^[0-9]+\.[0-9]+\.[0-9]+ ]] || die "could not read a semver version from pyproject.toml's [project] (found '${VERSION}')"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"

start=$(date +%s)
WORK="$(mktemp -d -t torchjob-kubectl-plugin.XXXXXX)"
trap 'rm -rf "${WORK}"' EXIT
STAGE="${WORK}/stage"
mkdir -p "${STAGE}" "${DIST}/krew"

# This working tree as a wheel (pure Python), built from a copy: setuptools' build/ in the
# checkout would keep modules deleted since (and race a concurrent build).
log "torchjob ${VERSION}: building the wheel"
mkdir -p "${WORK}/src"
tar -C "${REPO}" --exclude=__pycache__ -cf - pyproject.toml README.md LICENSE runtime operator |
  tar -C "${WORK}/src" -xf -
"${UV}" build --quiet --wheel --out-dir "${WORK}/wheel" "${WORK}/src"
wheel="$(ls "${WORK}"/wheel/torchjob-*.whl)"
# The venv's versions (not torchjob itself, which is editable there), for its Python version.
"${UV}" pip freeze --quiet --python "${PY}" --exclude-editable | grep -v '^torchjob==' >"${WORK}/constraints.txt"
venv_pyver="$("${PY}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
# The kubernetes client's asyncio flavour (kubernetes.aio, 40 MB of generated code) and its
# aiohttp stack: the CLI uses the synchronous client, which imports neither. An override whose
# marker never holds drops aiohttp (and what only it needs) from the resolution.
printf '%s ; sys_platform == "never"\n' aiohttp aiohttp-retry >"${WORK}/overrides.txt"

for pyver in ${PYTHON_VERSIONS}; do
  site="${WORK}/site-${pyver}"
  pins=() how="the newest wheels for it"
  if [[ "${pyver}" == "${venv_pyver}" ]]; then
    pins=(--constraint "${WORK}/constraints.txt") how="the venv's versions"
  fi
  log "CPython ${pyver}: installing torchjob + kubernetes (manylinux x86_64, ${how})"
  "${UV}" pip install --quiet --target "${site}" \
    --python-version "${pyver}" --python-platform x86_64-manylinux2014 \
    --only-binary :all: "${pins[@]}" --override "${WORK}/overrides.txt" "${wheel}" "kubernetes>=30"
  # The operator package, the console scripts (with the build machine's shebang) and the
  # asyncio client are not part of the CLI.
  rm -rf "${site:?}/torchjob_operator" "${site:?}/bin" "${site:?}/kubernetes/aio"
  # What records this build's temporary paths and times (so that two builds are equal).
  rm -f "${site}"/*.dist-info/direct_url.json "${site}"/*.dist-info/uv_cache.json \
    "${site}"/torchjob-*.dist-info/RECORD
  "${SHIV}" --site-packages "${site}" \
    --entry-point torchjob.cli.main:kubectl_main \
    --python "/usr/bin/env python${pyver}" --compressed --reproducible \
    --output-file "${STAGE}/kubectl-torchjob-py${pyver}.pyz" >"${WORK}/shiv.log" 2>&1 || { cat "${WORK}/shiv.log" >&2;
    die "shiv failed for CPython ${pyver}"; }
done
install -m 0755 "${HACK_DIR}/kubectl-torchjob" "${STAGE}/kubectl-torchjob"
install -m 0644 LICENSE "${STAGE}/LICENSE"
chmod 0755 "${STAGE}"/*.pyz

archive="${DIST}/${ARCHIVE_NAME}"
(cd "${STAGE}" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
  tar --create --no-recursion --files-from - --owner=0 --group=0 --numeric-owner \
    --mtime="@${SOURCE_DATE_EPOCH}" --format=gnu) | gzip -9 -n >"${archive}.tmp"
mv "${archive}.tmp" "${archive}"
sha="$(sha256sum "${archive}" | cut -d' ' -f1)"

carried="${PYTHON_VERSIONS// /, }"
manifest="${DIST}/krew/torchjob.yaml"
cat >"${manifest}.tmp" <<EOF
# Generated by hack/kubectl-plugin.sh for ${ARCHIVE_NAME} (sha256 below); do not edit.
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: torchjob
spec:
  version: v${VERSION}
  homepage: ${HOMEPAGE}
  shortDescription: Get, describe and follow TorchJobs (elastic PyTorch training)
  description: |
    The torchjob CLI as a kubectl plugin: kubectl torchjob get, describe, history, logs,
    dashboard, submit, scale and delete for the TorchJobs of the torchjob operator. It is the
    same code as the torchjob command: it reads the cluster through your kubeconfig.
    It runs on the machine's python3 (CPython ${carried}); the archive carries one
    self-contained zipapp per version and no other dependency.
  caveats: |
    kubectl torchjob needs python3 (CPython ${carried}) on the PATH, or TORCHJOB_PYTHON set
    to one. Its first run unpacks its dependencies into ~/.shiv (SHIV_ROOT to change).
  platforms:
  - selector:
      matchLabels:
        os: linux
        arch: amd64
    uri: ${HOMEPAGE}/releases/download/v${VERSION}/${ARCHIVE_NAME}
    sha256: "${sha}"
    bin: kubectl-torchjob
    files:
    - from: kubectl-torchjob
      to: .
    - from: kubectl-torchjob-py3.*.pyz
      to: .
    - from: LICENSE
      to: .
EOF
mv "${manifest}.tmp" "${manifest}"

log "built in $(($(date +%s) - start))s:"
find "${STAGE}" -mindepth 1 -printf '  %10s  %f\n' | LC_ALL=C sort -k2 >&2
log "${archive} ($(du -h "${archive}" | cut -f1), sha256 ${sha})"
log "${manifest}"
