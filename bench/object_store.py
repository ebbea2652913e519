"""A checkpoint's round trip through ``torchjob.checkpoint`` on an S3-compatible object store
beside the local-disk path: commit (upload, manifest, marker) and restore (find the latest
committed checkpoint, download and verify every file), for a ``--mib`` MiB checkpoint.

The object store is SeaweedFS' ``weed server -s3`` built by `make testbin` (component
``seaweedfs``), started on this machine by the same code as the tests (tests/s3.py), so the
figures measure the protocol and the client over loopback, not a network. Prints medians of
``--repeats`` runs. Asserts nothing.

    python bench/object_store.py [--mib 256] [--repeats 3] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import kube as k  # noqa: E402
from tests.s3 import start_s3_server, stop_s3_server  # noqa: E402

from torchjob.checkpoint import CheckpointStorage  # noqa: E402
from torchjob.checkpoint.remote import forget_checked  # noqa: E402


def _round_trip(url: str, src: str, scratch: Path) -> tuple[float, float]:
    storage = CheckpointStorage(url)
    t = time.perf_counter()
    storage.commit(src)
    commit = time.perf_counter() - t
    out = scratch / f"restore-{time.monotonic_ns()}"
    t = time.perf_counter()
    latest = CheckpointStorage(url).latest_committed()
    assert latest is not None
    CheckpointStorage(url).download(latest, str(out))
    restore = time.perf_counter() - t
    shutil.rmtree(out)
    return commit, restore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    args = parser.parse_args()
    weed = k.testbin_root() / f"seaweedfs-{k.read_versions()['SEAWEEDFS_VERSION']}" / "weed"
    if not weed.is_file():
        sys.exit(f"{weed} not built: run `make testbin` (or hack/build-testbin.sh seaweedfs)")

    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tj-bench-store-") as root_s:
        root = Path(root_s)
        src = root / "ckpt"
        src.mkdir()
        # Four shards, as a sharded state dict would be; random, so nothing compresses.
        shard = args.mib // 4
        for i in range(4):
            (src / f"shard{i}.pt").write_bytes(os.urandom(shard << 20))
        server = start_s3_server(root / "seaweedfs")
        try:
            fs = server.fs()
            fs.mkdir("bench")
            os.environ.update(server.env())
            forget_checked()
            runs: dict[str, list[tuple[float, float]]] = {"local disk": [], "object store": []}
            for r in range(args.repeats):
                runs["local disk"].append(
                    _round_trip(str(root / "local" / f"r{r}"), str(src), root)
                )
                runs["object store"].append(_round_trip(f"s3://bench/r{r}", str(src), root))
        finally:
            stop_s3_server(server)

    mib = 4 * shard
    print(f"checkpoint round trip, {mib} MiB in 4 files, median of {args.repeats}")
    print(
        f"{'storage':<14}{'commit s':>10}{'restore s':>11}{'commit MiB/s':>14}{'restore MiB/s':>15}"
    )
    for name, times in runs.items():
        commit = statistics.median(c for c, _ in times)
        restore = statistics.median(r for _, r in times)
        print(
            f"{name:<14}{commit:>10.2f}{restore:>11.2f}{mib / commit:>14.0f}{mib / restore:>15.0f}"
        )


if __name__ == "__main__":
    main()
