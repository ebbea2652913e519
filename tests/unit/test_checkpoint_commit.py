"""The one commit protocol (``torchjob.checkpoint.commit``): a whole-object and a sharded
checkpoint are committed by the same steps, and each, half-written (no marker) or with a
missing or corrupt manifest, is refused naming the file, on local disk and in memory://."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from torchjob.checkpoint import (
    MANIFEST,
    MARKER,
    CheckpointError,
    CheckpointStorage,
    CommittedCheckpoint,
    committed_at,
)
from torchjob.checkpoint.sharded import commit_written, hash_files, is_sharded, new_target


def _whole(storage: CheckpointStorage, tmp_path: Path) -> CommittedCheckpoint:
    user = tmp_path / f"user-{uuid.uuid4().hex[:6]}"
    user.mkdir()
    (user / "model.pt").write_bytes(b"weights")
    return storage.commit(str(user), metrics={"loss": 0.5})


def _sharded(storage: CheckpointStorage, tmp_path: Path) -> CommittedCheckpoint:
    target = new_target(storage)
    for rel, data in {"__0_0.distcp": b"shard0", ".metadata": b"meta"}.items():
        storage.fs.pipe_file(f"{target.write_path}/{rel}", data)
    files = hash_files(storage, target.write_url, ["__0_0.distcp", ".metadata"])
    return commit_written(storage, target, files, world_size=1, metrics={"step": 3})


KINDS: dict[str, Callable[[CheckpointStorage, Path], CommittedCheckpoint]] = {
    "whole": _whole,
    "sharded": _sharded,
}


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> CheckpointStorage:
    if request.param == "local":
        return CheckpointStorage(str(tmp_path / "run"))
    return CheckpointStorage(f"memory://torchjob-commit/{uuid.uuid4().hex}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_both_kinds_commit_through_the_same_steps(
    storage: CheckpointStorage, tmp_path: Path, kind: str
) -> None:
    ckpt = KINDS[kind](storage, tmp_path)
    found = committed_at(ckpt.path)
    assert found is not None and found[1] == ckpt
    assert is_sharded(ckpt) == (kind == "sharded")
    assert storage.fs.exists(storage.join(ckpt.path.rsplit("/", 1)[-1], MARKER))
    assert not [n for n in storage.fs.ls(storage.root, detail=False) if ".tmp-" in n]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("no marker", rf"{MARKER} is missing.*half-written"),
        ("no manifest", rf"{MANIFEST} is missing"),
        ("corrupt manifest", rf"{MANIFEST} does not match its commit marker"),
    ],
)
def test_a_half_written_or_corrupt_checkpoint_is_refused_naming_the_file(
    storage: CheckpointStorage, tmp_path: Path, kind: str, damage: str, named: str
) -> None:
    older = KINDS[kind](storage, tmp_path)
    ckpt = KINDS[kind](storage, tmp_path)
    base = storage.join(ckpt.path.rsplit("/", 1)[-1])
    if damage == "no marker":
        storage.fs.rm(f"{base}/{MARKER}")
    elif damage == "no manifest":
        storage.fs.rm(f"{base}/{MANIFEST}")
    else:
        data = storage.fs.cat_file(f"{base}/{MANIFEST}")
        storage.fs.pipe_file(f"{base}/{MANIFEST}", data.replace(b'"index": 2', b'"index": 7'))
    with pytest.raises(CheckpointError, match=named) as info:
        committed_at(ckpt.path)
    assert info.value.path == ckpt.path
    if damage == "no marker":  # a listing skips a save that did not finish
        assert storage.latest_committed() == older
    else:  # a marked directory must be intact: listing it fails loudly
        with pytest.raises(CheckpointError, match=named):
            storage.latest_committed()


def test_a_directory_of_the_users_own_files_is_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "model.pt").write_bytes(b"w")
    assert committed_at(str(tmp_path / "mine")) is None


def test_checkpoint_to_directory_refuses_a_half_written_one(tmp_path: Path) -> None:
    from torchjob.train import Checkpoint

    storage = CheckpointStorage(str(tmp_path / "run"))
    ckpt = _whole(storage, tmp_path)
    out = Checkpoint(ckpt.path).to_directory(str(tmp_path / "out"))
    assert (Path(out) / "model.pt").read_bytes() == b"weights"
    (Path(ckpt.path) / MARKER).unlink()
    with pytest.raises(CheckpointError, match=rf"checkpoint_000001: {MARKER} is missing"):
        Checkpoint(ckpt.path).to_directory(str(tmp_path / "again"))
