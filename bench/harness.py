"""The harness every benchmark shares: a cluster brought up and down (hack/cluster.sh), kubectl
and CRDs, an operator process started and measured (CPU-seconds and RSS from /proc), waits, the
statistics a table prints (median, percentiles, ``median [min-max]`` over
repeats) and the raw result files (JSON lines, gzip-compressed where they are kept).

Standard library only at import (a benchmark that forks workers must hold no thread, and
``kubernetes`` is imported where a function needs it). Run the benchmarks as scripts
(``python bench/goodput.py``, as the Makefile does) or as modules (``python -m bench.goodput``).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

REPO = Path(__file__).resolve().parents[1]


def logger(tag: str) -> Callable[[str], None]:
    """``log(msg)`` printing ``[tag HH:MM:SS] msg`` to stderr (``tag`` may be empty)."""
    prefix = f"{tag} " if tag else ""

    def log(msg: str) -> None:
        print(f"[{prefix}{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


log = logger("")


# --- waits and timers -----------------------------------------------------------------------
def wait_for(what: str, probe: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """``probe()``'s first truthy answer; a ``TimeoutError`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


# --- the cluster ----------------------------------------------------------------------------
def testbin_root() -> Path:
    return Path(os.environ.get("TORCHJOB_TESTBIN_ROOT") or Path.home() / ".cache/torchjob/testbin")


def cluster_env(name: str) -> dict[str, str]:
    return {**os.environ, "TORCHJOB_CLUSTER_NAME": name}


def cluster_up(name: str, attempts: int = 3) -> Path:
    """The private kwokctl cluster ``name`` (``make testbin`` first); its kubeconfig."""
    subprocess.run(["make", "-s", "testbin"], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    for attempt in range(attempts):  # on a loaded machine the nodes may miss cluster.sh's 60 s
        out = subprocess.run(
            [str(REPO / "hack/cluster.sh"), "up"],
            env=cluster_env(name),
            capture_output=True,
            text=True,
        )
        if not out.returncode:
            return Path(out.stdout.strip().splitlines()[-1])
        log(f"hack/cluster.sh up failed (attempt {attempt + 1}):\n{out.stderr.strip()}")
        cluster_down(name)
    sys.exit(f"error: hack/cluster.sh up failed {attempts} times")


def cluster_down(name: str | None = None) -> None:
    env = cluster_env(name) if name else None
    subprocess.run([str(REPO / "hack/cluster.sh"), "down"], env=env, check=False)


def kubectl(kubeconfig: Path, *argv: str, input_: str | None = None) -> str:
    """The testbin's kubectl against ``kubeconfig``; a ``RuntimeError`` with its stderr."""
    versions = dict(
        line.split("=", 1)
        for line in (REPO / "hack/versions.env").read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    binary = testbin_root() / f"kubernetes-{versions['KUBE_VERSION']}" / "kubectl"
    out = subprocess.run(
        [str(binary), "--kubeconfig", str(kubeconfig), *argv],
        input=input_,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise RuntimeError(f"kubectl {' '.join(argv)}: {out.stderr.strip()}")
    return out.stdout


def apply(kubeconfig: Path, *objects: dict[str, Any]) -> str:
    """``kubectl apply`` of ``objects`` (one List)."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    return kubectl(kubeconfig, "apply", "-f", "-", input_=body)


def wait_established(kubeconfig: Path, crd: str) -> None:
    """``kubectl wait`` fails outright while a fresh CRD has no status yet: retry."""
    deadline = time.monotonic() + 120
    while True:
        try:
            kubectl(kubeconfig, "wait", "--for=condition=Established", "--timeout=60s", crd)
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def has_default_sa(core: Any, ns: str) -> bool:
    """Whether namespace ``ns`` has its ``default`` ServiceAccount yet (pods need it)."""
    try:
        core.read_namespaced_service_account("default", ns)
        return True
    except Exception:
        return False


# --- operator processes ---------------------------------------------------------------------
@dataclass
class Proc:
    """An operator process: its CPU-seconds and RSS come from /proc."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


def start_torchjob_operator(kubeconfig: Path, workdir: Path) -> tuple[Proc, int]:
    """torchjob-operator from this checkout as a local process; (it, its metrics port)."""
    port, metrics_port = free_port(), free_port()
    log_path = workdir / "torchjob-operator.log"
    popen = subprocess.Popen(
        [sys.executable, "-m", "torchjob_operator", "--kubeconfig", str(kubeconfig),
         "--liveness", f"http://127.0.0.1:{port}/healthz", "--metrics-port", str(metrics_port)],
        stdout=log_path.open("wb"), stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )  # fmt: skip
    proc = Proc("torchjob", popen, log_path)
    wait_for("torchjob-operator /healthz", lambda: http_ok(f"http://127.0.0.1:{port}/healthz"), 90)
    return proc, metrics_port


# --- statistics over repeats ----------------------------------------------------------------
def median(xs: Iterable[float]) -> float:
    """The median of the numbers that are not NaN (NaN when none)."""
    kept = [x for x in xs if x == x]
    return statistics.median(kept) if kept else float("nan")


def percentile(xs: Iterable[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of the values at or below it."""
    kept = sorted(x for x in xs if x == x)
    if not kept:
        return float("nan")
    return kept[min(len(kept) - 1, max(0, math.ceil(q * len(kept)) - 1))]


def pct(xs: Iterable[float], q: float) -> float:
    """The value at the rounded index ``q x (n - 1)`` (the goodput and scale tables')."""
    s = sorted(xs)
    if not s:
        return float("nan")
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def spread(values: Iterable[float], fmt: str = "{:.2f}", suffix: str = "") -> str:
    """``median [min-max]`` of the repeats, each as ``fmt`` gives it, then ``suffix``."""
    vs = [v for v in values if v == v]
    if not vs:
        return "-"
    lo, mid, hi = (fmt.format(v) for v in (min(vs), statistics.median(vs), max(vs)))
    return f"{mid}{suffix} [{lo}-{hi}]"


# --- result files ---------------------------------------------------------------------------
def open_text(path: Path) -> IO[str]:
    """``path`` for reading as text; ``x.jsonl.gz`` is decompressed, and ``x.jsonl`` that is
    not there is read from ``x.jsonl.gz`` (bench/results keeps its raw files compressed)."""
    if path.suffix != ".gz" and not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix == ".gz":
        return gzip.open(path, "rt")
    return path.open()


def read_jsonl(path: Path, *, partial: bool = False) -> list[dict[str, Any]]:
    """Every line of a JSON-lines file (plain or gzip). ``partial``: a file being written,
    whose last line may be cut, or not there yet (an empty list)."""
    try:
        with open_text(path) as f:
            text = f.read()
    except OSError:
        if partial:
            return []
        raise
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if not partial:
                raise
    return out


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """``rows`` as JSON lines; gzip-compressed (reproducibly: no timestamp) when ``path`` ends
    in ``.gz``. Returns ``path``."""
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        return write_gz(path, text)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def write_gz(path: Path, text: str) -> Path:
    """``text`` gzip-compressed (reproducibly: no timestamp, no name) into ``path``. Returns
    ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as raw, gzip.GzipFile("", "wb", fileobj=raw, mtime=0) as f:
        f.write(text.encode())
    return path


def data_files(folder: Path, pattern: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern`` (e.g. ``*-events.jsonl``), plain or
    compressed (``.gz``), sorted, each once (a plain file wins over its compressed copy)."""
    found = {p.name: p for p in folder.glob(pattern + ".gz")}
    found.update({p.name + ".gz": p for p in folder.glob(pattern)})
    return sorted(found.values())


def strip_gz(name: str) -> str:
    return name[: -len(".gz")] if name.endswith(".gz") else name


def copy_compressed(src: Path, dst: Path) -> Path:
    """``src``'s bytes into ``dst`` (``.gz``: compressed, reproducibly). Returns ``dst``."""
    data = src.read_bytes()
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.suffix == ".gz":
        with dst.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
            f.write(data)
    else:
        dst.write_bytes(data)
    return dst
