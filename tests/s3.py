"""A real S3-compatible object store for the tests: SeaweedFS' ``weed server -s3`` (built by
`make testbin`, component ``seaweedfs``), on free ports with a temporary data directory and
one S3 identity. No mock: the storage code talks to it through s3fs and botocore, configured
by the environment a pod would get (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_ENDPOINT_URL``).

``s3_server`` (session fixture) starts one server; ``s3`` (per test) gives a fresh bucket and
points the environment at the server. ``Outage`` is a TCP proxy in front of it that can refuse
every connection for a while (the object store restarting, a network partition).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import kube as k

ACCESS_KEY = "torchjob-test"
SECRET_KEY = "torchjob-test-secret-0123456789"
REGION = "us-east-1"


def weed_binary() -> Path:
    """The built ``weed``; a failure in CI (make test builds it), a skip elsewhere."""
    version = k.read_versions()["SEAWEEDFS_VERSION"]
    path = k.testbin_root() / f"seaweedfs-{version}" / "weed"
    if not path.is_file():
        msg = f"{path} not built: run `make testbin` (or hack/build-testbin.sh seaweedfs)"
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"CI=true and {msg}", pytrace=False)
        pytest.skip(msg)
    return path


def _free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct free ports on ``host`` (held open together so that none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class S3Server:
    """One running ``weed server -s3``: its endpoint and the identity it accepts."""

    endpoint: str
    data_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]

    def env(self, *, key: str = ACCESS_KEY, secret: str = SECRET_KEY) -> dict[str, str]:
        """What a pod's env would say (botocore reads these; s3fs passes them through)."""
        return {
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
        }

    def fs(self) -> Any:
        """An s3fs filesystem with the server's identity (for setting up and inspecting)."""
        import s3fs

        return s3fs.S3FileSystem(
            key=ACCESS_KEY,
            secret=SECRET_KEY,
            endpoint_url=self.endpoint,
            client_kwargs={"region_name": REGION},
            skip_instance_cache=True,
        )

    def make_bucket(self) -> str:
        name = f"tj-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name

    def logs(self, tail: int = 40) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-tail:])


def _identities(path: Path) -> None:
    path.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "torchjob",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )


def _answers(endpoint: str) -> bool:
    import s3fs

    fs = s3fs.S3FileSystem(
        key=ACCESS_KEY,
        secret=SECRET_KEY,
        endpoint_url=endpoint,
        client_kwargs={"region_name": REGION},
        config_kwargs={"retries": {"max_attempts": 1}, "connect_timeout": 2, "read_timeout": 5},
        skip_instance_cache=True,
    )
    try:
        fs.ls("")
        return True
    except Exception:
        return False


def start_s3_server(root: Path, timeout: float = 120.0, ip: str = "127.0.0.1") -> S3Server:
    """``weed server`` with master, volume, filer and S3 on free ports under ``root``, every
    one of them listening on ``ip`` only (the loopback, or the host end of the real node's
    veth: tests/cluster/realnode.py ``start_node_s3``).

    Buckets are never created on upload (``-s3.autoCreateBucket=false``, as on AWS), no
    anonymous access, no telemetry, no other gateway."""
    weed = weed_binary()
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    config = root / "s3.json"
    _identities(config)
    master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = _free_ports(8, ip)
    log_path = root / "weed.log"
    args = [
        str(weed),
        "server",
        f"-dir={data}",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-master.port={master}",
        f"-master.port.grpc={master_grpc}",
        "-master.telemetry=false",
        # Every bucket is a collection that grows 7 volumes at once: room for many buckets.
        "-master.volumeSizeLimitMB=64",
        "-volume.max=200",
        f"-volume.port={volume}",
        f"-volume.port.grpc={volume_grpc}",
        f"-filer.port={filer}",
        f"-filer.port.grpc={filer_grpc}",
        f"-filer.localSocket={root / 'filer.sock'}",
        "-s3",
        f"-s3.port={s3}",
        f"-s3.port.grpc={s3_grpc}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.localSocket={root / 's3.sock'}",
        f"-s3.config={config}",
        "-s3.autoCreateBucket=false",
        "-s3.iam=false",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True
        )
    server = S3Server(endpoint=f"http://{ip}:{s3}", data_dir=data, log_path=log_path, proc=proc)
    deadline = time.monotonic() + timeout
    while not _answers(server.endpoint):
        if proc.poll() is not None:
            raise RuntimeError(f"weed server exited {proc.returncode}:\n{server.logs()}")
        if time.monotonic() > deadline:
            stop_s3_server(server)
            raise RuntimeError(f"weed server did not answer in {timeout}s:\n{server.logs()}")
        time.sleep(0.5)
    return server


def stop_s3_server(server: S3Server) -> None:
    if server.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.proc.pid, signal.SIGTERM)
        try:  # its volume server waits 10 s for the master to notice: the data are thrown away
            server.proc.wait(2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(15)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    pytest.importorskip("s3fs", reason="the s3 extra (s3fs) is not installed")
    server = start_s3_server(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        stop_s3_server(server)


@dataclass
class S3:
    """One test's view: the server, a fresh bucket, and the environment set for it."""

    server: S3Server
    bucket: str
    monkeypatch: pytest.MonkeyPatch

    def url(self, *parts: str) -> str:
        return "/".join([f"s3://{self.bucket}", *parts])

    def use(self, env: dict[str, str]) -> None:
        """Point the process's environment (and new s3fs instances) at ``env``."""
        import s3fs

        from torchjob.checkpoint.remote import forget_checked

        for key, value in env.items():
            self.monkeypatch.setenv(key, value)
        s3fs.S3FileSystem.clear_instance_cache()
        forget_checked()


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3]:
    view = S3(s3_server, s3_server.make_bucket(), monkeypatch)
    view.use(s3_server.env())
    yield view
    view.use({})


class Outage:
    """A TCP proxy to ``target``; while ``down`` it resets every connection, old and new."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit("//", 1)[-1].rsplit(":", 1)
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.down = threading.Event()
        self.stopped = threading.Event()
        self.refused = 0
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _reset(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            conn.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            conn.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.down.is_set():
                self.refused += 1
                self._reset(conn)
                continue
            threading.Thread(target=self._pipe, args=(conn,), daemon=True).start()

    def _pipe(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target)
        except OSError:
            self._reset(conn)
            return
        with self._lock:
            self._conns += [conn, upstream]
        pair = {conn: upstream, upstream: conn}
        open_ = set(pair)
        graceful = False
        try:
            while open_ and not self.down.is_set() and not self.stopped.is_set():
                ready, _, _ = select.select(list(open_), [], [], 0.1)
                for s in ready:
                    data = s.recv(1 << 16)
                    if data:
                        pair[s].sendall(data)
                    else:  # a half-close: pass it on, keep the other direction
                        open_.discard(s)
                        with contextlib.suppress(OSError):
                            pair[s].shutdown(socket.SHUT_WR)
            graceful = not open_
        except OSError:
            pass
        finally:
            for s in pair:
                if graceful:
                    s.close()
                else:
                    self._reset(s)

    def cut(self, seconds: float) -> threading.Thread:
        """Reset every connection now and refuse new ones for ``seconds``, in the background."""
        self.down.set()

        def heal() -> None:
            time.sleep(seconds)
            self.down.clear()

        t = threading.Thread(target=heal, daemon=True)
        t.start()
        return t

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
