"""The logs of a TorchJob's worker pods (``TorchJobClient.logs``): a pod's whole log, every
pod's log merged in timestamp order, and the follow streams, one daemon thread per pod, that
feed one queue of :class:`LogLine`.
"""

from __future__ import annotations

import contextlib
import queue
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from torchjob import contract
from torchjob.client.errors import TorchJobClientError, TorchJobNotFound, api_error

_TS_LINE = re.compile(r"^(\S+) (.*)$")


@dataclass(frozen=True)
class LogLine:
    """One line of a worker pod's log."""

    pod_index: int
    pod: str
    text: str


def read_log(
    core: Any, pod: str, ns: str, container: str | None, *, timestamps: bool = False
) -> str:
    """A pod's whole log as text (raw bytes decoded: the generated client would parse a
    log that happens to be one JSON document and return its Python repr)."""
    try:
        resp = core.read_namespaced_pod_log(
            pod, ns, container=container, timestamps=timestamps, _preload_content=False
        )
        data = resp.data
    except Exception as e:
        raise api_error(e, f"logs of pod {ns}/{pod}") from e
    return bytes(data).decode("utf-8", errors="replace")


def snapshot(core: Any, pods: Iterable[Any], ns: str, container: str | None) -> Iterator[LogLine]:
    """Every started pod's log so far, merged in timestamp order."""
    stamped: list[tuple[str, int, LogLine]] = []
    for pod in pods:
        if not has_started(pod):
            continue
        text = read_log(core, pod.metadata.name, ns, container, timestamps=True)
        for seq, raw in enumerate(text.splitlines()):
            m = _TS_LINE.match(raw)
            ts, body = (m.group(1), m.group(2)) if m else ("", raw)
            stamped.append((ts, seq, LogLine(pod_index(pod), pod.metadata.name, body)))
    stamped.sort(key=lambda x: (x[0], x[2].pod_index, x[1]))
    for _, _, line in stamped:
        yield line


def finish_follow(
    core: Any,
    pods: list[Any],
    streams: dict[str, PodStream],
    ns: str,
    container: str | None,
    lines: queue.Queue[LogLine],
) -> Iterator[LogLine]:
    """The job ended: hang up every stream, then yield what they had not delivered yet, and
    the rest of each pod's log from a full read."""
    delivered = {uid: stream.close() for uid, stream in streams.items()}
    while not lines.empty():
        yield lines.get_nowait()
    for pod in pods:
        if not has_started(pod):
            continue
        index, pname = pod_index(pod), pod.metadata.name
        try:
            text = read_log(core, pname, ns, container)
        except TorchJobNotFound:
            continue  # deleted since: what it wrote was streamed
        except TorchJobClientError as e:
            yield LogLine(index, pname, f"[torchjob] cannot read logs: {e}")
            continue
        for raw in text.splitlines()[delivered.get(pod.metadata.uid, 0) :]:
            yield LogLine(index, pname, raw)


class PodStream:
    """One pod's ``follow`` log stream, read by a daemon thread into a shared queue.

    ``close()`` hangs up from the caller's thread and returns how many of the pod's lines
    were delivered; no line is queued after it, so a later full read can resume exactly.
    """

    def __init__(
        self, core: Any, pod: Any, ns: str, container: str | None, out: queue.Queue[LogLine]
    ) -> None:
        self.core = core
        self.index = pod_index(pod)
        self.pod = str(pod.metadata.name)
        self.ns = ns
        self.container = container
        self.out = out
        self.lines = 0
        self._lock = threading.Lock()
        self._closed = False
        self._resp: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _put(self, text: str, *, counted: bool = True) -> bool:
        with self._lock:
            if self._closed:
                return False
            self.out.put(LogLine(self.index, self.pod, text))
            if counted:
                self.lines += 1
            return True

    def close(self) -> int:
        with self._lock:
            self._closed = True
            resp, self._resp = self._resp, None
            delivered = self.lines
        if resp is not None:
            hang_up(resp)
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5)
        return delivered

    def _run(self) -> None:
        try:
            resp = self.core.read_namespaced_pod_log(
                self.pod, self.ns, container=self.container, follow=True, _preload_content=False
            )
        except Exception as e:
            self._put(f"[torchjob] cannot read logs: {api_error(e, self.pod)}", counted=False)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._resp = resp
        if closed:
            hang_up(resp)
            return
        pending = b""
        try:
            for chunk in resp.stream(4096):
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    if not self._put(raw.decode("utf-8", errors="replace")):
                        return
        except Exception as e:  # connection dropped (or hung up by close(): not reported)
            self._put(f"[torchjob] log stream ended: {e}", counted=False)
        finally:
            if pending:
                self._put(pending.decode("utf-8", errors="replace"))
            with contextlib.suppress(Exception):
                resp.release_conn()


def hang_up(resp: Any) -> None:
    """Close a streaming response, waking a thread blocked reading it (urllib3 >= 2.3)."""
    with contextlib.suppress(Exception):
        resp.shutdown()
    with contextlib.suppress(Exception):
        resp.close()


def pod_index(pod: Any) -> int:
    labels = (pod.metadata.labels or {}) if pod.metadata else {}
    try:
        return int(labels.get(contract.LABEL_POD_INDEX, -1))
    except ValueError:
        return -1


def has_started(pod: Any) -> bool:
    """Logs can be read once a container has run: not while the pod is Pending."""
    phase = pod.status.phase if pod.status else None
    return phase in ("Running", "Succeeded", "Failed")
