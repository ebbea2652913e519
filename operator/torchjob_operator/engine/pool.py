"""The write fan-out pool: the threads that carry out one reconcile's concurrent writes
(pod creates, relabels, deletes). The ``Operator`` owns it and passes it to the controllers;
no module keeps it in a global."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class WritePool:
    """One long-lived pool for the concurrent writes of every object. A pool per reconcile
    started and ended up to 16 threads each time: CPU for nothing, and every new thread may
    take a fresh malloc arena that keeps its memory after the burst."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max_workers
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def executor(self) -> ThreadPoolExecutor:
        """The pool, started on first use (again after ``release``)."""
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.max_workers, thread_name_prefix="torchjob-io"
                )
            return self._pool

    def release(self) -> None:
        """End the pool's threads (their stacks go back to the kernel); the next write starts
        a new pool. Called when the operator has no object left, and at shutdown."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
