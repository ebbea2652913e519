"""The one error type of checkpoint storage; its message always names the path."""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt, or storage failed. ``path`` says where."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"checkpoint {path}: {problem}")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (CheckpointError, (self.path, self.problem))
