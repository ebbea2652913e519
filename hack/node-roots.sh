# shellcheck shell=bash
# Sourced by hack/node.sh: a real node's containerd root, seeded with the images it runs.
#
# Importing the images into each node (`ctr images import`) streams, hashes and writes every
# layer again (1.75 GB: operator, runtime-cpu, pause), and the node unpacks them again when it
# starts its first container: on the 2-core machine, with the other test sessions starting
# beside it, the import alone took 130 s for 3 nodes. Instead, one containerd root is prepared
# per set of image archives, with the images imported *and unpacked* (a throwaway containerd,
# no CRI), and kept in $TORCHJOB_NODE_ROOTS (default ~/.cache/torchjob/node-roots, the two
# newest kept); a node starts from a hard-linked copy of it. What a containerd never changes
# in place is shared: content blobs (by digest) and the committed snapshots (overlay lower
# layers: a container writes to its own upper layer). Its databases are copied, so each node
# keeps its own records. A node that a later `import` gives other images imports them as
# before. A new set of archives is imported on top of a copy of the newest root, so only
# the layers a commit changed are written and unpacked again.

NODE_ROOTS="${TORCHJOB_NODE_ROOTS:-${HOME}/.cache/torchjob/node-roots}"

roots_key() { # roots_key TAR...: the name of the root that holds these archives' images
  { containerd --version; for t in "$@"; do basename "${t}"; done | sort; } | sha256sum | cut -c1-16
}

ROOT_VERSION=.torchjob-containerd-version # in each root: the containerd that made it

base_root() { # base_root: the newest root made by this containerd, to import on top of
  local version d
  version="$(containerd --version)"
  while IFS= read -r d; do
    if [[ -f "${d}/${ROOT_VERSION}" && "$(<"${d}/${ROOT_VERSION}")" == "${version}" ]]; then
      echo "${d}"
      return 0
    fi
  done < <(find "${NODE_ROOTS}" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' |
    sort -rn | cut -d' ' -f2-)
}

link_root() { # link_root SRC DST: DST a hard-linked copy of the root SRC, its databases copied
  local src="$1" dst="$2" f
  if [[ "$(stat -c %d "${src}")" == "$(stat -c %d "$(dirname "${dst}")")" ]]; then
    cp -al "${src}" "${dst}"
  else
    cp -a --reflink=auto "${src}" "${dst}" # another filesystem: no hard links
  fi
  # What containerd writes in place is the copy's own: its bolt databases.
  while IFS= read -r -d '' f; do
    rm -f "${dst}/${f}"
    cp -p "${src}/${f}" "${dst}/${f}"
  done < <(cd "${src}" && find . -type f -name '*.db' -print0)
}

build_root() { # build_root DIR TAR...: a containerd root with the tars imported and unpacked
  local dir="$1" tmp sock pid tar i start base
  shift
  start=$(now_ms)
  tmp="$(mktemp -d "${NODE_ROOTS}/.build-XXXXXX")"
  # A new commit changes the runtime image's top layers only: on top of the newest root (a
  # hard-linked copy), the import finds every other layer's blob and snapshot there and
  # skips it; only the new layers are written and unpacked.
  base=""
  [[ -n "${NO_BASE:-}" ]] || base="$(base_root)"
  [[ -z "${base}" ]] || link_root "${base}" "${tmp}/root"
  sock="/run/torchjob-seed-$$.sock" # a unix socket path must be short
  cat >"${tmp}/config.toml" <<EOF
version = 2
root = "${tmp}/root"
state = "${tmp}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "${sock}"
[ttrpc]
  address = "${sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "${tmp}/opt"
EOF
  containerd --config "${tmp}/config.toml" >"${tmp}/containerd.log" 2>&1 &
  pid=$!
  for i in $(seq 300); do [[ -S "${sock}" ]] && break; sleep 0.1; done
  if [[ ! -S "${sock}" ]]; then
    kill "${pid}" 2>/dev/null || true
    die "the seeding containerd did not start: $(tail -5 "${tmp}/containerd.log")"
  fi
  for tar in "$@"; do
    if ! ctr --address "${sock}" -n k8s.io images import --snapshotter overlayfs "${tar}" >/dev/null; then
      kill "${pid}" 2>/dev/null || true
      wait "${pid}" 2>/dev/null || true
      rm -rf "${tmp}"
      # On top of a base root, a snapshot its records name may be gone from its disk (seen
      # once: "parent snapshot ... does not exist"); the caller builds from nothing then.
      [[ -z "${base}" ]] || return 2
      die "ctr images import ${tar} into the seeded root failed"
    fi
  done
  if [[ -n "${base}" ]]; then
    # The images the base held under the same names now point at the new ones: a removal
    # (of a throwaway tag) runs containerd's garbage collection at once, which removes the
    # old images' layers, blobs and snapshots, from this root only (its links).
    local any
    any="$(ctr --address "${sock}" -n k8s.io images ls -q | sed -n 1p)"
    ctr --address "${sock}" -n k8s.io images tag "${any}" torchjob.local/gc:now >/dev/null &&
      ctr --address "${sock}" -n k8s.io images rm --sync torchjob.local/gc:now >/dev/null ||
      log "could not collect the base root's old layers (they stay, unused)"
  fi
  rm -f "${tmp}/root/${ROOT_VERSION}" # a link to the base's: write a file of this root's own
  containerd --version >"${tmp}/root/${ROOT_VERSION}"
  kill "${pid}" 2>/dev/null || true
  wait "${pid}" 2>/dev/null || true
  rm -f "${sock}" "${sock}.ttrpc"
  mv "${tmp}/root" "${dir}"
  rm -rf "${tmp}"
  log "prepared the seeded node root ${dir##*/} (images imported and unpacked${base:+ on top of ${base##*/}}) in $(($(now_ms) - start))ms"
}

seeded_root() { # seeded_root TAR...: print the root that holds these images, preparing it once
  local key dir
  mkdir -p "${NODE_ROOTS}"
  key="$(roots_key "$@")"
  dir="${NODE_ROOTS}/${key}"
  (
    flock -w 900 8 || die "could not lock ${NODE_ROOTS}/.lock within 900s"
    if [[ ! -d "${dir}" ]]; then
      if ! build_root "${dir}" "$@"; then
        log "importing on top of the newest seeded root failed; building ${key} from nothing"
        NO_BASE=1 build_root "${dir}" "$@"
      fi
      # The two newest roots stay (the images of this checkout and of the one before); a
      # node started from an older one keeps its hard links.
      find "${NODE_ROOTS}" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' |
        sort -rn | tail -n +3 | cut -d' ' -f2- | xargs -r rm -rf
      find "${NODE_ROOTS}" -mindepth 1 -maxdepth 1 -type d -name '.build-*' -mmin +60 -exec rm -rf {} +
    fi
    touch "${dir}"
  ) 8>"${NODE_ROOTS}/.lock" || return 1
  echo "${dir}"
}

seed_node() { # seed_node TAR...: the selected node's containerd root from the seeded root
  local src dst
  src="$(seeded_root "$@")" || return 1
  dst="${STATE}/containerd/root"
  rm -rf "${dst}"
  link_root "${src}" "${dst}"
  printf '%s\n' "$@" >"${STATE}/imported"
}
