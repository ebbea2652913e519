"""Background commits (torchjob.checkpoint.background): same atomic protocol, staged by links,
and a process SIGKILLed while a background commit runs never leaves a committed-but-incomplete
checkpoint."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchjob.checkpoint import CheckpointError, CheckpointStorage
from torchjob.checkpoint.background import BackgroundCommitter, stage, sweep_orphans


def _user_dir(root: Path, i: int, size: int = 1000) -> str:
    d = root / f"user-{i}"
    (d / "sub").mkdir(parents=True)
    (d / "model.pt").write_bytes(bytes([i % 256]) * size)
    (d / "sub" / "extra.txt").write_text(f"step {i}")
    return str(d)


def test_stage_links_the_files_so_the_caller_may_delete_its_directory(tmp_path: Path) -> None:
    src = _user_dir(tmp_path, 7)
    staged = stage(src)
    assert os.stat(Path(staged) / "model.pt").st_ino == os.stat(Path(src) / "model.pt").st_ino
    (Path(src) / "model.pt").unlink()
    assert (Path(staged) / "model.pt").read_bytes() == bytes([7]) * 1000
    assert (Path(staged) / "sub" / "extra.txt").read_text() == "step 7"


def test_commits_in_order_and_the_caller_keeps_going(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "run"))
    seen: list[int] = []
    committer = BackgroundCommitter(storage, on_commit=lambda c: seen.append(c.metrics["i"]))
    for i in range(4):
        src = _user_dir(tmp_path, i)
        committer.submit(src, metrics={"i": i}, data_positions=[{"epoch": 0, "offset": i}])
        os.rename(src, src + "-gone")  # the caller's temporary directory goes at once
    last = committer.wait()
    assert last is not None and last.metrics["i"] == 3
    assert seen == [0, 1, 2, 3]
    committed = storage.list_committed()
    assert [c.metrics["i"] for c in committed] == [0, 1, 2, 3]
    for c in committed:
        files = storage.read_files(c)  # verifies every checksum
        assert files["model.pt"] == bytes([c.metrics["i"]]) * 1000
    assert c.data_positions == [{"epoch": 0, "offset": 3}]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".torchjob-staged-")]


def test_a_failed_background_commit_is_raised_by_the_next_call(tmp_path: Path) -> None:
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    committer = BackgroundCommitter(CheckpointStorage(str(blocker)))
    committer.submit(_user_dir(tmp_path, 1))
    with pytest.raises(CheckpointError, match="saving failed"):
        committer.wait()
    assert committer.wait() is None  # raised once


_SAVER = textwrap.dedent(
    """
    import os, sys, tempfile
    from torchjob.checkpoint import CheckpointStorage
    from torchjob.checkpoint.background import BackgroundCommitter
    run, scratch = sys.argv[1], sys.argv[2]
    committer = BackgroundCommitter(CheckpointStorage(run))
    for i in range(10_000):
        d = tempfile.mkdtemp(dir=scratch)
        for j in range(6):
            with open(os.path.join(d, f"part{j}.bin"), "wb") as f:
                f.write(bytes([i % 256]) * 400_000)
        committer.submit(d, metrics={"i": i})
        os.system(f"rm -rf {d}")
        print(i, flush=True)
    """
)


def test_sigkill_during_a_background_commit_never_leaves_a_committed_partial(
    tmp_path: Path,
) -> None:
    run, scratch = tmp_path / "run", tmp_path / "scratch"
    scratch.mkdir()
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(run), str(scratch)], stdout=subprocess.PIPE
        )
        assert proc.stdout is not None
        for _ in range(2 + round_):  # returns of submit(): background commits are in flight
            proc.stdout.readline()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        storage = CheckpointStorage(str(run))
        committed = storage.list_committed()
        assert committed  # submit() waits for the previous commit: the first one finished
        for ckpt in committed:
            files = storage.read_files(ckpt)  # verifies every checksum against the manifest
            assert len(files) == 6
            assert {data[0] for data in files.values()} == {ckpt.metrics["i"] % 256}
        storage.remove_incomplete()
        assert not [n for n in os.listdir(run) if n.startswith(".tmp-")]
    # A killed saver's staging directory (beside its temporary directories; there when the
    # kill landed mid-commit) is removed by the next stage() there; the one in flight stays.
    ours = stage(_user_dir(scratch, 99))
    assert [n for n in os.listdir(scratch) if n.startswith(".torchjob-staged-")] == [
        os.path.basename(ours)
    ]


def test_a_file_rewritten_in_place_during_its_commit_is_an_error_not_a_checkpoint(
    tmp_path: Path,
) -> None:
    """torch.save() over the same path truncates the inode the staged link shares: the
    commit must notice, name the file, and commit nothing."""
    storage = CheckpointStorage(str(tmp_path / "run"))
    src = _user_dir(tmp_path, 1, size=64 << 20)
    rewritten = False

    def rewrite_then_verify() -> None:
        nonlocal rewritten
        with open(Path(src) / "model.pt", "r+b") as f:  # same inode, as torch.save does
            f.write(b"\x02" * 10)
        rewritten = True

    committer = BackgroundCommitter(storage)
    real_commit = storage.commit

    def commit(*args: object, verify: object = None, **kwargs: object):  # type: ignore[no-untyped-def]
        def both() -> None:
            rewrite_then_verify()
            assert callable(verify)
            verify()

        return real_commit(*args, verify=both, **kwargs)  # type: ignore[arg-type]

    storage.commit = commit  # type: ignore[method-assign]
    committer.submit(src, metrics={"i": 1})
    with pytest.raises(CheckpointError, match=r"model\.pt.*rewritten") as info:
        committer.wait()
    assert rewritten and "async_commit=False" in str(info.value)
    assert storage.list_committed() == []


def test_only_this_hosts_staging_directories_of_dead_pids_are_swept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    host = socket.gethostname()
    names = [
        f".torchjob-staged-{host}_{dead.pid}_x",  # killed mid-commit: swept
        f".torchjob-staged-{host}_{os.getpid()}_x",  # in flight here: kept
        f".torchjob-staged-{host}-1_{dead.pid}_x",  # another pod's, over a shared filesystem
        ".torchjob-staged-abc123",  # an older release's name: no owner to check
    ]
    for name in names:
        (tmp_path / name).mkdir()
    assert sweep_orphans(str(tmp_path)) == [names[0]]
    assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
