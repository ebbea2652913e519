"""The runtime's settings and a worker's launch environment: each read once from the
environment into a frozen value, every variable declared once with its default and doc.

:class:`RuntimeSettings` holds what a user may set (``TORCHJOB_SILENT_PEER_S``...): the
table in docs/runtime.md ("Runtime settings") is :func:`settings_table`, and a unit test
keeps the two equal. :class:`WorkerEnv` is what the driver tells each worker process it
starts (the torchrun variables and the launcher's own ``TORCHJOB_LAUNCH_*``), parsed once
when the worker starts and again when it re-forms (``torchjob.launch.worker``).

Who reads them: a worker process at its start (``WorkerProcess``), a ``WorkerGroup`` when
it is made (over its ``env``), ``zygote.prepare``, ``shard_mirror.enabled``. Nothing in
``torchjob.launch`` reads ``os.environ`` for these names elsewhere. A value that does not
parse raises :class:`SettingError`, naming the variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, Literal, TypeVar, cast

from torchjob import contract
from torchjob.launch.layout import StoreLayout

WorkerStart = Literal["auto", "zygote", "fork", "spawn"]
WORKER_STARTS: Final = ("auto", "zygote", "fork", "spawn")

SLOW_EXIT_S: Final = 2.0
"""A part of a pod's exit (its worker processes, a zygote, in-flight store requests) that
takes longer is said in the log: a stopping pod is paid for until it is gone."""

ENV_SILENT_PEER_S: Final = "TORCHJOB_SILENT_PEER_S"
ENV_WORKER_START: Final = "TORCHJOB_WORKER_START"
ENV_START_TIMEOUT_S: Final = "TORCHJOB_WORKER_START_TIMEOUT_S"
ENV_NCCL_REFORM: Final = "TORCHJOB_NCCL_REFORM"
ENV_SHARD_MIRROR: Final = "TORCHJOB_SHARD_MIRROR"
ENV_RESTORE_POINT_BUDGET: Final = "TORCHJOB_RESTORE_POINT_BUDGET"
ENV_RESTORE_POINT_EVERY: Final = "TORCHJOB_RESTORE_POINT_EVERY"
ENV_RESTORE_POINT_SHM: Final = "TORCHJOB_RESTORE_POINT_SHM"
ENV_RESTORE_POINT_OVERLAP: Final = "TORCHJOB_RESTORE_POINT_OVERLAP"
ENV_RESTORE_POINT_DIR: Final = "TORCHJOB_LAUNCH_RESTORE_POINT_DIR"
ENV_USE_LIBUV: Final = "USE_LIBUV"
ENV_MALLOC_TUNING: Final = "TORCHJOB_MALLOC_TUNING"
ENV_NCCL_ASYNC_ERROR_HANDLING: Final = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
ENV_DRIVER_ADDR: Final = "TORCHJOB_LAUNCH_DRIVER"
ENV_TOKEN: Final = "TORCHJOB_LAUNCH_TOKEN"
ENV_DRIVER_PID: Final = "TORCHJOB_LAUNCH_DRIVER_PID"
ENV_STORE_SERVED: Final = "TORCHJOB_LAUNCH_STORE_SERVED"

T = TypeVar("T")


class SettingError(ValueError):
    """An environment variable's value does not parse: the message names the variable."""


# --- parsers: raw string -> value, ValueError with the reason --------------------------------
def _seconds(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a number of seconds") from None
    if value < 0 or value != value:
        raise ValueError("must be a number of seconds >= 0")
    return value


def _positive_seconds(raw: str) -> float:
    value = _seconds(raw)
    if value == 0:
        raise ValueError("must be a number of seconds > 0")
    return value


def _start(raw: str) -> WorkerStart:
    if raw not in WORKER_STARTS:
        raise ValueError(f"must be one of {', '.join(WORKER_STARTS)}")
    return cast(WorkerStart, raw)


def _is_one(raw: str) -> bool:
    return raw == "1"


def _on_unless_off(raw: str) -> bool:
    return raw.strip().lower() not in ("0", "false", "off", "no")


def _libuv(raw: str) -> bool:
    return raw not in ("0", "false", "False")


def _text(raw: str) -> str:
    return raw


def _optional_text(raw: str) -> str | None:
    return raw


def _int(raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError("is not an integer") from None


def _share(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("is not a share of the training time (e.g. 0.02)") from None
    if not 0 < value <= 1:
        raise ValueError("must be a share of the training time, > 0 and <= 1 (e.g. 0.02)")
    return value


def _every(raw: str) -> int | None:
    if raw.strip().lower() == "auto":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError("must be `auto` or a number of reports >= 1") from None
    if value < 1:
        raise ValueError("must be `auto` or a number of reports >= 1")
    return value


def _port(raw: str) -> int:
    value = _int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("is not a port (0-65535)")
    return value


def setting(
    env: str,
    default: T,
    doc: str,
    parse: Callable[[str], T],
    *,
    empty_is_default: bool = True,
    shown: str | None = None,
) -> Any:
    """A field read from ``env`` (``parse``d; ``default`` when unset, or empty unless
    ``empty_is_default`` is False), documented by ``doc`` (``shown``: the default as the
    table writes it, if not ``default`` itself)."""
    meta = {
        "env": env,
        "doc": doc,
        "parse": parse,
        "empty_is_default": empty_is_default,
        "shown": shown if shown is not None else f"`{default}`" if default != "" else "none",
    }
    return dataclasses.field(default=default, metadata=meta)


def _read(cls: type[T], environ: Mapping[str, str]) -> T:
    values: dict[str, Any] = {}
    for f in fields(cls):  # type: ignore[arg-type]
        env = f.metadata["env"]
        raw = environ.get(env)
        if raw is None or (raw == "" and f.metadata["empty_is_default"]):
            continue
        try:
            values[f.name] = f.metadata["parse"](raw)
        except ValueError as exc:
            raise SettingError(f"{env}={raw!r} {exc}") from None
    return cls(**values)


@dataclass(frozen=True)
class RuntimeSettings:
    """What a user may set in the environment of a driver or a pod (docs/runtime.md)."""

    silent_peer_s: float = setting(
        ENV_SILENT_PEER_S,
        3.0,
        "Seconds after which a rank whose heartbeat has not moved is silent (a vanished "
        "node, a partition, a stopped process) and is taken for lost; 0 turns the "
        "watchdog off (a silent rank is then found at the collective timeout).",
        _seconds,
        shown="`3`",
    )
    worker_start: WorkerStart = setting(  # noqa: RUF009  # a str Literal: immutable
        ENV_WORKER_START,
        "auto",
        "How worker processes start: `auto` and `zygote` fork them from the zygote (Linux), "
        "`fork` from the driver where that is safe, `spawn` as fresh interpreters.",
        _start,
        shown="`auto`",
    )
    start_timeout_s: float = setting(
        ENV_START_TIMEOUT_S,
        120.0,
        "Seconds a group's worker processes may take to start and connect to their driver "
        "before the start fails (a hung import or fork; a worker that exits is seen at "
        "once). Raise it on a machine so loaded that importing torch takes minutes.",
        _positive_seconds,
        shown="`120`",
    )
    nccl_reform: bool = setting(
        ENV_NCCL_REFORM,
        False,
        "`1`: an NCCL group re-forms in place after a lost peer (unverified on GPUs).",
        _is_one,
        shown="off",
    )
    shard_mirror: bool = setting(
        ENV_SHARD_MIRROR,
        True,
        "Sharded state is mirrored in a peer's memory at every report (`0`, `false`, "
        "`off` or `no` turn it off; `register_state(mirror=...)` wins).",
        _on_unless_off,
        empty_is_default=False,
        shown="on",
    )
    restore_point_budget: float = setting(
        ENV_RESTORE_POINT_BUDGET,
        0.02,
        "The share of training time the in-memory restore point's copies may take: "
        "`report()` takes one every k reports, k = copy time / (share x time between "
        "reports), and a loss costs up to k - 1 reports of steps (`register_state`).",
        _share,
        shown="`0.02`",
    )
    restore_point_every: int | None = setting(
        ENV_RESTORE_POINT_EVERY,
        None,
        "`auto`: as the budget above allows; `N`: a restore point every N reports whatever "
        "it costs (`1`: at every report).",
        _every,
        shown="`auto`",
    )
    restore_point_overlap: bool = setting(
        ENV_RESTORE_POINT_OVERLAP,
        True,
        "The registered optimizers' parameters and state are copied on a thread while the "
        "next step's forward and backward run; their `step()` waits for it (`0`, `false`, "
        "`off` or `no`: the whole copy inside `report()`, for a loop that changes "
        "parameters in place outside the optimizer's step).",
        _on_unless_off,
        empty_is_default=False,
        shown="on",
    )
    restore_point_shm: bool = setting(
        ENV_RESTORE_POINT_SHM,
        True,
        "The restore point's copies go to `/dev/shm`, where a worker process the driver "
        "replaces finds its predecessor's (`0`, `false`, `off` or `no`: the process's own "
        "memory only).",
        _on_unless_off,
        empty_is_default=False,
        shown="on",
    )
    malloc_tuning: bool = setting(
        ENV_MALLOC_TUNING,
        True,
        "Each worker fixes glibc malloc's thresholds (mmap 32 MiB, trim 128 MiB) so a step's "
        "large temporaries are reused, not faulted in again every step "
        "(`torchjob.launch.malloc`; `0`, `false`, `off` or `no`: glibc's defaults). "
        "Skipped where `MALLOC_*_THRESHOLD_` or another allocator is set.",
        _on_unless_off,
        empty_is_default=False,
        shown="on",
    )
    use_libuv: bool = setting(
        ENV_USE_LIBUV,
        True,
        "TCPStore's libuv backend (`0` where the image's torch lacks libuv), as torch's "
        "`env://` reads it.",
        _libuv,
        empty_is_default=False,
        shown="`1`",
    )
    nccl_async_error_handling: str | None = setting(
        ENV_NCCL_ASYNC_ERROR_HANDLING,
        None,
        "torch's own; NCCL workers that may be kept after a lost peer get `0` unless it is set.",
        _optional_text,
        empty_is_default=False,
        shown="unset",
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RuntimeSettings:
        """The settings of ``environ`` (this process's environment by default); raises
        :class:`SettingError` naming the variable whose value does not parse."""
        return _read(cls, os.environ if environ is None else environ)


@dataclass(frozen=True)
class WorkerEnv:
    """What the driver sets for each worker process it starts (not set by hand): its place in
    the group (the torchrun variables) and how to reach the driver."""

    rank: int = setting(contract.RANK, 0, "The worker's global rank.", _int)
    local_rank: int = setting(contract.LOCAL_RANK, 0, "Its rank on this host.", _int)
    world_size: int = setting(contract.WORLD_SIZE, 1, "Ranks in the group.", _int)
    local_world_size: int = setting(contract.LOCAL_WORLD_SIZE, 1, "Ranks on this host.", _int)
    node_rank: int = setting(contract.NODE_RANK, 0, "This host's rank.", _int)
    generation: int = setting(
        contract.TORCHELASTIC_RESTART_COUNT, 0, "The group's generation.", _int
    )
    master_addr: str = setting(
        contract.MASTER_ADDR, "127.0.0.1", "The rendezvous store's host.", _text
    )
    master_port: int = setting(contract.MASTER_PORT, 0, "The rendezvous store's port.", _port)
    store_served: int = setting(
        ENV_STORE_SERVED,
        0,
        "`N` > 0: the driver serves the rendezvous store (a local group; its N-th formation "
        "there keys the rendezvous apart); `0`: rank 0 serves it.",
        _int,
    )
    driver_addr: str = setting(ENV_DRIVER_ADDR, "", "`host:port` of the driver's socket.", _text)
    token: str = setting(ENV_TOKEN, "", "The group's token, said in the worker's hello.", _text)
    restore_point_dir: str = setting(
        ENV_RESTORE_POINT_DIR,
        "",
        "The driver's directory in `/dev/shm` where the restore points outlive the worker "
        "processes (empty: none).",
        _text,
    )
    driver_pid: int = setting(
        ENV_DRIVER_PID,
        0,
        "The driver's pid, watched by the worker (0: its parent).",
        _int,
    )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WorkerEnv:
        """The worker's environment, parsed; raises :class:`SettingError` naming the variable."""
        return _read(cls, os.environ if environ is None else environ)

    def layout(self, settings: RuntimeSettings) -> StoreLayout:
        """This generation's store: where it is, how to connect, where its keys live."""
        return StoreLayout(
            self.master_addr,
            self.master_port,
            self.generation,
            formation=self.store_served,
            use_libuv=settings.use_libuv,
        )


def settings_table(cls: type[Any] = RuntimeSettings) -> str:
    """The Markdown table of ``cls``'s variables (docs/runtime.md holds the same text)."""
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    for f in fields(cls):
        rows.append(f"| `{f.metadata['env']}` | {f.metadata['shown']} | {f.metadata['doc']} |")
    return "\n".join(rows)
