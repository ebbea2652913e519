"""Live progress of a local run with rich: generation, workers, reports, latest metrics.

Driven by the controller from rank 0's report events; messages about restarts
and resizes print above the live line so they stay in the scrollback.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn


def _fmt(metrics: dict[str, Any], limit: int = 5) -> str:
    parts = []
    for k, v in list(metrics.items())[:limit]:
        parts.append(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


class ProgressView:
    """A rich live line when enabled; plain printed messages otherwise."""

    def __init__(self, *, enabled: bool, total_epochs: int | None, console: Console | None = None):
        self._console = console or Console(stderr=True)
        self._enabled = enabled
        self._total = total_epochs
        self._progress: Progress | None = None
        self._task: Any = None
        self._generation = 0
        self._workers = 0

    def __enter__(self) -> ProgressView:
        if self._enabled:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[metrics]}"),
                TimeElapsedColumn(),
                console=self._console,
                transient=False,
                # No refresh thread: the controller calls tick() twice a second, so the
                # driver stays single-threaded and can fork its workers (launch._start).
                auto_refresh=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("starting", total=self._total, metrics="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def tick(self) -> None:
        """Redraw (the spinner and the elapsed time move between reports)."""
        if self._progress is not None:
            self._progress.refresh()

    def message(self, text: str) -> None:
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)

    def generation(self, generation: int, workers: int) -> None:
        self._generation, self._workers = generation, workers
        if self._progress is not None:
            self._progress.update(self._task, description=f"gen {generation} · {workers} workers")
            self._progress.refresh()

    def report(self, metrics: dict[str, Any], index: int) -> None:
        if self._progress is None:
            return
        epoch = metrics.get("epoch")
        completed = epoch + 1 if isinstance(epoch, int) and self._total else None
        self._progress.update(
            self._task,
            completed=completed,
            description=f"gen {self._generation} · {self._workers} workers · report {index}",
            metrics=_fmt(metrics),
        )
        self._progress.refresh()
