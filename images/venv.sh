#!/bin/sh
# The images' virtual env /opt/torchjob, built in two stages so that the image gets it in two
# layers (images/runtime/Dockerfile, images/operator/Dockerfile; run from /src):
#
#   venv.sh deps EXTRAS [VENV_ARG...]  the dependencies, from pyproject.toml alone (the
#       package's code and README.md are stubs here), their bytecode compiled, pip removed;
#       only pyproject.toml (or this script) changes this layer, so every commit's image
#       shares it, and a node that holds an earlier image already has it unpacked
#   venv.sh code OUT  torchjob itself, from /src, installed with a pip from outside the venv;
#       every file the install added, its bytecode with them, is copied under OUT: the
#       image's last layer, a few MB
#
# The bytecode is compiled here, once (pip's __pycache__ dropped first: its timestamp checks
# would follow the copy into the image): a pod never writes bytecode (PYTHONDONTWRITEBYTECODE,
# uid 1000), so without it every process of every pod compiled what it imported from the venv
# (torchjob, pydantic, fsspec, ...) again: `import torch, torchjob.train.torch` took 2.7 s of
# user CPU with bytecode against 3.2 s without, measured in the runtime image.
set -eu
VENV=/opt/torchjob
compile() { "${VENV}/bin/python" -m compileall -q -f --invalidation-mode unchecked-hash "$@"; }
files() { (cd / && find "${VENV#/}" \( -type f -o -type l \) | LC_ALL=C sort); }
case "$1" in
deps)
  extras="$2"
  shift 2
  touch README.md && mkdir -p runtime operator
  python3 -m venv "$@" "${VENV}"
  "${VENV}/bin/pip" install --disable-pip-version-check ".[${extras}]"
  "${VENV}/bin/pip" uninstall -y --disable-pip-version-check torchjob pip
  find "${VENV}" -name __pycache__ -prune -exec rm -rf {} +
  compile "${VENV}/lib"
  ;;
code)
  out="$2"
  python3 -m venv /tmp/pip # the image's venv has no pip
  files >/tmp/before
  /tmp/pip/bin/pip --python "${VENV}/bin/python" install --disable-pip-version-check \
    --no-deps --no-compile .
  files | LC_ALL=C comm -13 /tmp/before - | grep '\.py$' | sed 's|^|/|' | compile -i -
  mkdir -p "${out}"
  files | LC_ALL=C comm -13 /tmp/before - | (cd / && tar -cf - -T -) | tar -xf - -C "${out}"
  test -n "$(ls -A "${out}")" || { echo "venv.sh code: the install added nothing" >&2; exit 1; }
  ;;
*)
  echo "usage: venv.sh deps EXTRAS [VENV_ARG...] | venv.sh code OUT" >&2
  exit 2
  ;;
esac
