"""Checkpoint storage: atomic commit, verification, retention, on local disk and in memory://."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from torchjob.checkpoint import (
    MARKER,
    CheckpointError,
    CheckpointStorage,
    DataPosition,
    latest_committed,
)


def _user_dir(tmp_path: Path, payload: bytes = b"weights") -> str:
    d = tmp_path / f"user-{uuid.uuid4().hex[:6]}"
    (d / "sub").mkdir(parents=True)
    (d / "model.pt").write_bytes(payload)
    (d / "sub" / "extra.txt").write_text("hello")
    return str(d)


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    if request.param == "local":
        return CheckpointStorage(str(tmp_path / "run"))
    return CheckpointStorage(f"memory://torchjob-test/{uuid.uuid4().hex}")


def test_round_trip(storage: CheckpointStorage, tmp_path: Path) -> None:
    assert storage.latest_committed() is None
    pos = DataPosition(
        epoch=2, samples_in_epoch=96, epoch_complete=False, world_size=3, dataset_size=1000
    )
    c1 = storage.commit(_user_dir(tmp_path, b"a"), metrics={"loss": 1.0})
    c2 = storage.commit(
        _user_dir(tmp_path, b"b"), metrics={"loss": 0.5}, data_positions=[pos.to_dict()]
    )
    assert (c1.index, c2.index) == (1, 2)
    latest = storage.latest_committed()
    assert latest is not None and latest.index == 2
    assert latest.metrics == {"loss": 0.5}
    assert DataPosition.from_dict(latest.data_positions[0]) == pos
    files = storage.read_files(latest)
    assert files == {"model.pt": b"b", "sub/extra.txt": b"hello"}
    out = tmp_path / "restored"
    storage.download(latest, str(out))
    assert (out / "sub" / "extra.txt").read_text() == "hello"


def test_a_manifest_says_the_report_number_it_was_taken_at_when_told(
    storage: CheckpointStorage, tmp_path: Path
) -> None:
    """``report``: the run's report number (``torchjob.train.report``'s count over every
    generation), read back as ``CommittedCheckpoint.report``; a checkpoint committed without
    one (an older manifest) reads None."""
    storage.commit(_user_dir(tmp_path), metrics={"step": 3}, report=12)
    storage.commit(_user_dir(tmp_path), metrics={"step": 4})
    assert [c.report for c in storage.list_committed()] == [12, None]


def test_incomplete_directory_is_ignored_and_cleaned(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "run"))
    storage.commit(_user_dir(tmp_path))
    # A save that crashed after the rename but before the marker, and one before the rename.
    half = tmp_path / "run" / "checkpoint_000002"
    half.mkdir()
    (half / "model.pt").write_bytes(b"partial")
    (tmp_path / "run" / ".tmp-checkpoint_000003-deadbeef").mkdir()
    latest = latest_committed(str(tmp_path / "run"))
    assert latest is not None and latest.index == 1
    assert storage.next_index() == 4
    assert sorted(storage.remove_incomplete()) == [
        ".tmp-checkpoint_000003-deadbeef",
        "checkpoint_000002",
    ]


def test_corrupt_file_error_names_path(storage: CheckpointStorage, tmp_path: Path) -> None:
    ckpt = storage.commit(_user_dir(tmp_path, b"good"))
    storage.fs.pipe_file(storage.join("checkpoint_000001", "model.pt"), b"evil")
    with pytest.raises(CheckpointError) as info:
        storage.read_files(ckpt)
    assert ckpt.path in str(info.value)
    assert "model.pt" in str(info.value)


def test_missing_file_and_bad_marker_name_path(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "run"))
    ckpt = storage.commit(_user_dir(tmp_path))
    os.remove(Path(ckpt.path) / "sub" / "extra.txt")
    with pytest.raises(CheckpointError, match=r"checkpoint_000001.*sub/extra.txt.*missing"):
        storage.read_files(ckpt)
    (Path(ckpt.path) / MARKER).write_text("0" * 64)
    with pytest.raises(CheckpointError, match=r"checkpoint_000001.*corrupt"):
        storage.latest_committed()


@pytest.mark.parametrize(
    ("score", "order", "expected"),
    [
        pytest.param(None, "max", [4, 5], id="newest"),
        pytest.param("acc", "max", [2, 4, 5], id="best-acc-plus-latest"),
        pytest.param("loss", "min", [1, 2, 5], id="lowest-loss-plus-latest"),
    ],
)
def test_retention(tmp_path: Path, score: str | None, order: str, expected: list[int]) -> None:
    storage = CheckpointStorage(str(tmp_path / "run"))
    for acc, loss in [(0.1, 0.1), (0.9, 0.2), (0.3, 0.9), (0.8, 0.8), (0.2, 0.7)]:
        storage.commit(_user_dir(tmp_path), metrics={"acc": acc, "loss": loss})
    storage.apply_retention(2, score_attribute=score, score_order=order)
    assert [c.index for c in storage.list_committed()] == expected


_SAVER = textwrap.dedent(
    """
    import os, sys, tempfile
    from torchjob.checkpoint import CheckpointStorage
    storage = CheckpointStorage(sys.argv[1])
    src = tempfile.mkdtemp()
    i = 0
    while True:
        i += 1
        for k in range(8):
            with open(os.path.join(src, f"shard{k}.bin"), "wb") as f:
                f.write(bytes([i % 256]) * 200_000)
        storage.commit(src, metrics={"i": i})
        print(i, flush=True)
    """
)


def test_kill_during_save_never_leaves_a_valid_looking_partial(tmp_path: Path) -> None:
    run = str(tmp_path / "run")
    for delay in (0.6, 0.9, 1.3):
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, run], stdout=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()  # at least one commit finished
        time.sleep(delay * 0.1)  # land somewhere inside a later save
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        storage = CheckpointStorage(run)
        committed = storage.list_committed()
        assert committed
        for ckpt in committed:
            files = storage.read_files(ckpt)  # verifies every checksum
            assert len(files) == 8
            assert {data[0] for data in files.values()} == {ckpt.metrics["i"] % 256}
        storage.remove_incomplete()
