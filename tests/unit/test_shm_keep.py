"""The restore point in the pod's shared memory (``torchjob.train.recovery.shm_keep``).

A worker's copies go into a file the driver's directory holds; a process that replaces it
in the same slot (a formation given up, a lost local worker) maps the same restore point.
Here in one process: the "next process" is this one with its held restore point dropped
(``_HELD``) and its slot objects forgotten, so what it finds comes from the files alone.
The multi-process case (a group shut down and started again resumes from memory) is
tests/runtime/test_restore_point.py.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from torchjob.launch.settings import ENV_RESTORE_POINT_DIR
from torchjob.train.recovery import host_copy, restore_point, shm_keep


@pytest.fixture
def slot_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(ENV_RESTORE_POINT_DIR, str(tmp_path))
    _new_process()
    yield tmp_path
    _new_process()


def _new_process() -> None:
    """What a process that replaces the worker starts with: nothing held, no slot (the lost
    process's lock let go, as the kernel does when it dies)."""
    restore_point._HELD[0] = None
    slot, restore_point._SLOT[0] = restore_point._SLOT[0], None
    if slot is not None:
        os.close(slot._lock_fd)


def _state(seed: int, width: int = 8) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 3)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, width)).sum().backward()
    opt.step()
    return {"model": model, "optimizer": opt, "step": seed}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _arenas(d: Path) -> list[str]:
    return sorted(p.name for p in d.glob("slot-*.arena"))


def _manifests(d: Path) -> list[Path]:
    return sorted(d.glob("slot-*.manifest"))


def test_a_new_process_in_the_slot_maps_the_restore_point_its_predecessor_took(
    slot_dir: Path,
) -> None:
    live = _state(1)
    taken = restore_point.take("run", 7, live, [{"epoch": 0, "batch": 3}])
    assert taken is not None and taken.allocated and taken.arena is not None
    assert len(_manifests(slot_dir)) == 1 and len(_arenas(slot_dir)) == 1
    expected = restore_point.state_of(live)
    assert _equal(taken.state, expected)

    _new_process()
    found = restore_point._kept("run")
    assert found is not None and found.index == 7 and found.nbytes == taken.nbytes
    assert found.positions == [{"epoch": 0, "batch": 3}]
    assert _equal(found.state, expected)
    weight = found.state["model"]["weight"]
    assert found.arena is not None and found.arena.owns(weight), "mapped, not copied"
    assert restore_point._kept("another run") is None


def test_a_later_copy_writes_over_the_same_arena_and_a_reshaped_state_gets_a_new_one(
    slot_dir: Path,
) -> None:
    live = _state(1)
    first = restore_point.take("run", 1, live, [])
    assert first is not None and first.allocated
    arena = _arenas(slot_dir)
    live = _state(2)  # same shapes, other values
    second = restore_point.take("run", 2, live, [])
    assert second is not None and not second.allocated and _arenas(slot_dir) == arena
    _new_process()
    again = restore_point._kept("run")
    assert again is not None and again.index == 2
    assert _equal(again.state, restore_point.state_of(live))

    restore_point._HELD[0] = again  # the new process holds the mapped one; the state grows
    wider = _state(3, width=16)
    third = restore_point.take("run", 3, wider, [])
    assert third is not None and third.allocated
    assert len(_arenas(slot_dir)) == 1 and _arenas(slot_dir) != arena, "the old file removed"
    _new_process()
    last = restore_point._kept("run")
    assert last is not None and _equal(last.state, restore_point.state_of(wider))


def test_a_live_processs_slot_is_never_taken_and_the_newest_free_one_is(slot_dir: Path) -> None:
    # A kept process may take another local rank in the next generation: slots follow the
    # process (its lock), so a new process never maps an arena a live one writes.
    restore_point.take("run", 4, _state(1), [])
    live_slot = restore_point._SLOT[0]
    assert live_slot is not None
    other = shm_keep.Slot.claim(slot_dir, "run")
    assert other.name != live_slot.name, "the live process's slot is not free"
    older = _state(2)
    arena = other.allocate(shm_keep.arena_bytes(restore_point.state_of(older)))
    assert arena is not None
    state, _ = host_copy.copy_tree(restore_point.state_of(older), None, arena.alloc)
    other.commit(arena, {"run": "run", "index": 2, "rng": {}, "positions": [], "nbytes": 0}, state)
    os.close(other._lock_fd)  # its process is gone: report 2 is free
    _new_process()  # ... and now report 4's as well: the newest is taken
    found = restore_point._kept("run")
    assert found is not None and found.index == 4
    assert restore_point._SLOT[0] is not None and restore_point._SLOT[0].name == live_slot.name


def _slot_with(directory: Path, index: int) -> shm_keep.Slot:
    """Another live process's slot holding report ``index`` of ``run``."""
    slot = shm_keep.Slot.claim(directory, "run")
    live = restore_point.state_of(_state(index))
    arena = slot.allocate(shm_keep.arena_bytes(live))
    assert arena is not None
    state, _ = host_copy.copy_tree(live, None, arena.alloc)
    meta = {"run": "run", "index": index, "rng": {}, "positions": [], "nbytes": 0}
    slot.commit(arena, meta, state)
    return slot


def _files(d: Path, slot: shm_keep.Slot) -> list[str]:
    return sorted(p.name for p in d.glob(f"{slot.name}*"))


def test_a_free_slot_no_rank_will_agree_on_is_removed_at_the_next_take(slot_dir: Path) -> None:
    # A lost local worker that was never replaced (the job went on smaller): its pages
    # would stay until the fit ends. A live process's slot, and a free slot holding a
    # restore point as new as this one's, stay.
    restore_point.take("run", 1, _state(1), [])  # this process's own slot
    mine = restore_point._SLOT[0]
    assert mine is not None
    older, live, newer = (_slot_with(slot_dir, i) for i in (3, 2, 9))
    assert len({older.name, live.name, newer.name}) == 3
    assert len(_files(slot_dir, older)) == 3  # lock, manifest, arena
    os.close(older._lock_fd)  # their processes are gone
    os.close(newer._lock_fd)
    restore_point.take("run", 5, _state(5), [])
    assert _files(slot_dir, older) == [], "report 3 is older than the 5 this process holds"
    assert len(_files(slot_dir, live)) == 3 and len(_files(slot_dir, newer)) == 3
    assert restore_point._SLOT[0] is mine
    # A process that had opened the removed lock file before it went never takes that slot.
    os.close(live._lock_fd)
    _new_process()
    taken = shm_keep.Slot.claim(slot_dir, "run")
    assert taken.name == newer.name, "the newest free restore point (9) is taken"
    os.close(taken._lock_fd)


def test_a_copy_cut_off_before_its_commit_leaves_no_restore_point(
    slot_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    restore_point.take("run", 1, _state(1), [])

    def killed(*_a: Any, **_k: Any) -> None:
        raise KeyboardInterrupt  # the process dies between the copy and the manifest

    monkeypatch.setattr(shm_keep.Slot, "commit", killed)
    with pytest.raises(KeyboardInterrupt):
        restore_point.take("run", 2, _state(2), [])
    _new_process()
    assert restore_point._kept("run") is None, "half of report 2 over report 1: no restore point"


def test_an_overlapped_copy_commits_the_slot_only_once_its_thread_copied_everything(
    slot_dir: Path, copy_gate: threading.Event
) -> None:
    """``host_copy``: the optimizers' tensors are copied on a thread. Until it is done the
    slot holds no restore point (report 1's was invalidated, report 2's is not whole), so a
    process that replaced this one then would find none rather than half of one."""
    restore_point.take("run", 1, _state(1), [], overlap=True)
    copy_gate.set()
    restore_point.held()  # settled: report 1 committed
    copy_gate.clear()
    live = _state(2)
    restore_point.take("run", 2, live, [], overlap=True)
    try:
        assert restore_point._kept("run") is None, "in flight: nothing committed"
    finally:
        copy_gate.set()
    held = restore_point.held()
    assert held is not None and held.index == 2
    found = restore_point._kept("run")
    assert found is not None and found.index == 2
    assert _equal(found.state, restore_point.state_of(live))


def test_no_room_in_shared_memory_keeps_the_copy_in_the_process(
    slot_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(_fd: int, _off: int, _n: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    live = _state(1)
    with caplog.at_level(logging.WARNING):
        snap = restore_point.take("run", 1, live, [])
    assert snap is not None and snap.allocated
    assert snap.arena is not None and snap.arena.path is None, "private memory, not a file"
    assert _equal(snap.state, restore_point.state_of(live))
    assert "no room for the restore point" in caplog.text and str(slot_dir) in caplog.text
    assert _arenas(slot_dir) == [] and _manifests(slot_dir) == []
    again = restore_point.take("run", 2, live, [])
    assert again is not None and not again.allocated, "the private buffers are reused"


def test_a_manifest_that_does_not_load_is_named_and_ignored(
    slot_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    restore_point.take("run", 1, _state(1), [])
    [manifest] = _manifests(slot_dir)
    manifest.write_bytes(b"not a manifest")
    _new_process()
    with caplog.at_level(logging.WARNING):
        assert restore_point._kept("run") is None
    assert manifest.name in caplog.text


def test_a_dead_drivers_directory_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead = tmp_path / f"{shm_keep.PREFIX}{int(done.stdout)}-abc"
    live = tmp_path / f"{shm_keep.PREFIX}{os.getppid()}-def"
    # This pid's, not made by this process: a restarted container's driver has its pid.
    earlier = tmp_path / f"{shm_keep.PREFIX}{os.getpid()}-ghi"
    mine = shm_keep.make_dir(tmp_path)
    assert mine is not None
    for d in (dead, live, earlier):
        d.mkdir()
        (d / "rank0-1-1.arena").write_bytes(b"x" * 64)
    made = shm_keep.make_dir(tmp_path)
    assert made is not None and made.name.startswith(f"{shm_keep.PREFIX}{os.getpid()}-")
    assert not dead.exists() and not earlier.exists()
    assert live.exists() and mine.exists(), "a live driver's, and this process's other fit's"
    shm_keep.remove_dir(made)
    shm_keep.remove_dir(mine)
    assert not made.exists() and not mine.exists()
    assert shm_keep.make_dir(tmp_path / "absent") is None


def test_what_a_broadcast_sends_rebuilds_the_state_and_can_be_sent_on(slot_dir: Path) -> None:
    # torch.save refuses views of one storage as different dtypes (an arena), so the
    # broadcast sends the layout and the arena's bytes; the receiver keeps them as they
    # came, and sends them on unchanged when it is the source of a later broadcast.
    live = _state(1)
    held = restore_point.take("run", 3, live, [{"epoch": 1}])
    assert held is not None and held.arena is not None
    header, body = restore_point._encode(held)
    assert body.untyped_storage().data_ptr() == held.arena.data.untyped_storage().data_ptr()
    got = restore_point._decode(header, body.clone())
    assert got.index == 3 and got.positions == [{"epoch": 1}] and got.nbytes == held.nbytes
    assert _equal(got.state, restore_point.state_of(live))
    header2, body2 = restore_point._encode(got)
    again = restore_point._decode(header2, body2.clone())
    assert _equal(again.state, restore_point.state_of(live))
    _new_process()
    private = restore_point.Snapshot("run", 4, restore_point.state_of(_state(2)))
    header3, body3 = restore_point._encode(private)  # packed into a new block
    assert _equal(restore_point._decode(header3, body3).state, private.state)


def test_a_new_slot_is_locked_before_another_process_can_see_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's claim or prune that looks at the directory while this one creates
    its slot (here: between creating the lock file and locking it) must not find it unlocked
    and take it: the lock file gets its slot name only once locked (seen in CI: "could not
    lock the new restore point slot")."""
    taken: list[int] = []
    real_locked = shm_keep._locked

    def meanwhile(fd: int) -> bool:
        for lock in tmp_path.glob("slot-*.lock"):  # what another process's claim looks at
            other = os.open(lock, os.O_RDWR)
            if real_locked(other):
                taken.append(other)
            else:
                os.close(other)
        return real_locked(fd)

    monkeypatch.setattr(shm_keep, "_locked", meanwhile)
    slot = shm_keep.Slot.claim(tmp_path, "run")
    assert taken == [], "another process took the new slot before it was locked"
    assert [p.name for p in tmp_path.iterdir()] == [f"{slot.name}.lock"]
    monkeypatch.setattr(shm_keep, "_locked", real_locked)
    assert shm_keep._lock_free(tmp_path / f"{slot.name}.lock") is None, "held by its claimer"
