"""Checkpoint storage on a real S3-compatible object store (SeaweedFS, tests/s3.py): a
round trip, the atomic commit under a SIGKILLed upload, retries through an outage, and bad
credentials or a missing bucket reported at start-up with the bucket's name.

The storage is configured as in a pod: a plain ``s3://bucket/run`` URL, the endpoint and the
credentials in ``AWS_*`` environment variables (read by botocore through s3fs)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.s3 import S3, Outage

from torchjob import contract
from torchjob.checkpoint import MARKER, CheckpointError, CheckpointStorage, Retry, latest_committed
from torchjob.train.record import open_storage


def _user_dir(tmp_path: Path, name: str, payload: bytes) -> str:
    d = tmp_path / name
    (d / "sub").mkdir(parents=True)
    (d / "model.pt").write_bytes(payload)
    (d / "sub" / "optim.pt").write_bytes(payload[::-1])
    return str(d)


def test_round_trip_and_retention_on_a_real_object_store(s3: S3, tmp_path: Path) -> None:
    storage = CheckpointStorage(s3.url("runs", "job"))
    assert storage.is_remote and storage.latest_committed() is None
    big = os.urandom(3 << 20)
    first = storage.commit(_user_dir(tmp_path, "a", big), metrics={"loss": 1.0})
    second = storage.commit(_user_dir(tmp_path, "b", b"small"), metrics={"loss": 0.5})
    assert (first.index, second.index) == (1, 2)
    assert second.path == s3.url("runs", "job", "checkpoint_000002")

    # Another process (a new pod's rank 0) sees the same, through its own client.
    latest = latest_committed(s3.url("runs", "job"))
    assert latest is not None and latest.index == 2 and latest.metrics == {"loss": 0.5}
    files = storage.read_files(first)
    assert files == {"model.pt": big, "sub/optim.pt": big[::-1]}
    storage.download(first, str(tmp_path / "restored"))
    assert (tmp_path / "restored" / "model.pt").read_bytes() == big

    keys = s3.server.fs().find(f"{s3.bucket}/runs/job")
    assert f"{s3.bucket}/runs/job/checkpoint_000001/{MARKER}" in keys
    storage.commit(_user_dir(tmp_path, "c", b"third"), metrics={"loss": 0.7})
    storage.apply_retention(1, score_attribute="loss", score_order="min")
    assert [c.index for c in storage.list_committed()] == [2, 3]


_SAVER = textwrap.dedent(
    """
    import os, sys, tempfile, time
    from torchjob.checkpoint import CheckpointStorage
    url, hang = sys.argv[1], sys.argv[2] == "hang"
    storage = CheckpointStorage(url)
    src = tempfile.mkdtemp()
    def write(i, shards, size):
        for k in range(shards):
            with open(os.path.join(src, f"shard{k}.bin"), "wb") as f:
                f.write(bytes([i]) * size)
    write(1, 2, 1000)
    storage.commit(src, metrics={"i": 1})
    print("committed 1", flush=True)
    write(2, 16, 4 << 20)
    if not hang:  # stop for the kill after 3 of the 16 files: deterministic under any load
        put_file, done = storage.fs.put_file, []
        def put_then_stop(*args, **kwargs):
            put_file(*args, **kwargs)
            done.append(args)
            if len(done) == 3:
                print("uploading 2", flush=True)
                time.sleep(3600)
        storage.fs.put_file = put_then_stop
    def verify():
        if hang:
            print("uploaded 2", flush=True)
            time.sleep(3600)
    storage.commit(src, metrics={"i": 2}, verify=verify)
    print("committed 2", flush=True)
    """
)


@pytest.mark.parametrize("when", ["before-the-marker", "mid-upload"])
def test_an_upload_sigkilled_leaves_the_previous_checkpoint_the_latest(s3: S3, when: str) -> None:
    url = s3.url("run")
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVER, url, "hang" if when == "before-the-marker" else "go"],
        stdout=subprocess.PIPE,
        env=dict(os.environ),
        text=True,
    )
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "committed 1"
        inspect = s3.server.fs()
        partial = f"{s3.bucket}/run/checkpoint_000002"
        # before-the-marker: every file and the manifest are uploaded, only the marker is
        # missing; mid-upload: 3 of the 16 files are (the saver stops there for the kill).
        expected = "uploaded 2" if when == "before-the-marker" else "uploading 2"
        assert proc.stdout.readline().strip() == expected
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    inspect.invalidate_cache()
    left = inspect.find(partial)
    assert left, "the kill landed inside the second save"
    assert f"{partial}/{MARKER}" not in left, "the kill landed before the marker"

    storage = CheckpointStorage(url)
    latest = storage.latest_committed()
    assert latest is not None and latest.index == 1 and latest.metrics == {"i": 1}
    assert set(storage.read_files(latest)) == {"shard0.bin", "shard1.bin"}
    assert storage.next_index() == 3, "an incomplete save's index is never reused"
    assert storage.remove_incomplete() == ["checkpoint_000002"]
    inspect.invalidate_cache()
    assert not inspect.find(partial)


def test_an_outage_during_a_save_is_retried_and_the_save_commits(
    s3: S3, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = Outage(s3.server.endpoint)
    try:
        # botocore retries nothing here, so the storage's own retries must ride out the outage.
        s3.use({**s3.server.env(), "AWS_ENDPOINT_URL": proxy.endpoint, "AWS_MAX_ATTEMPTS": "1"})
        storage = CheckpointStorage(s3.url("run"), retry=Retry(attempts=6, wait_s=0.5))
        storage.commit(_user_dir(tmp_path, "a", b"one"))

        def outage() -> None:  # after the files and the manifest, before the marker
            proxy.cut(2.0)

        with caplog.at_level(logging.WARNING, logger="torchjob.checkpoint.remote"):
            ckpt = storage.commit(_user_dir(tmp_path, "b", b"two"), verify=outage)
        assert proxy.refused > 0, "the outage refused connections"
        assert "retrying" in caplog.text
        assert storage.latest_committed() == ckpt
        assert storage.read_files(ckpt)["model.pt"] == b"two"

        # An outage longer than the retries: a CheckpointError naming the checkpoint, and
        # nothing committed (the previous one stays the latest once the store is back).
        short = CheckpointStorage(s3.url("run"), retry=Retry(attempts=2, wait_s=0.2))
        healed = None
        with pytest.raises(CheckpointError) as info:

            def cut() -> None:
                nonlocal healed
                healed = proxy.cut(8.0)

            short.commit(_user_dir(tmp_path, "c", b"three"), verify=cut)
        assert "checkpoint_000003" in str(info.value) and s3.bucket in str(info.value)
        assert healed is not None
        healed.join()
        assert short.latest_committed() == ckpt
    finally:
        proxy.close()


@pytest.mark.parametrize("which", ["secret", "access-key"])
def test_bad_credentials_fail_at_start_up_naming_the_bucket(s3: S3, which: str) -> None:
    env = s3.server.env()
    if which == "secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret"
    else:
        env["AWS_ACCESS_KEY_ID"] = "nobody"
    s3.use(env)
    started = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        CheckpointStorage(s3.url("run"))
    message = str(info.value)
    assert f"bucket '{s3.bucket}'" in message and "denied" in message, message
    assert "AWS_ACCESS_KEY_ID" in message
    assert time.monotonic() - started < 30, "a permanent error is not retried"


def test_a_missing_bucket_fails_at_start_up_naming_it(s3: S3) -> None:
    with pytest.raises(CheckpointError) as info:
        CheckpointStorage("s3://no-such-bucket-torchjob/run")
    message = str(info.value)
    assert "bucket 'no-such-bucket-torchjob' does not exist" in message, message
    assert not s3.server.fs().exists("no-such-bucket-torchjob"), "never created"


def test_in_a_pod_the_start_up_error_is_the_termination_message(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the operator quotes in the job's status and Events (tests/cluster/test_real_node.py
    runs it in a real pod): one tagged line naming the bucket."""
    log = tmp_path / "termination-log"
    monkeypatch.setenv(contract.JOB_NAME, "job")
    monkeypatch.setenv(contract.TERMINATION_LOG, str(log))
    s3.use({**s3.server.env(), "AWS_ACCESS_KEY_ID": "nobody"})
    with pytest.raises(CheckpointError):
        open_storage(s3.url("run"), in_pod=True)
    summary = contract.parse_termination_message(log.read_text())
    assert summary is not None and not summary.peer_failure
    assert summary.line.startswith(f"CheckpointError: checkpoint {s3.url('run')}: ")
    assert f"access to bucket '{s3.bucket}' denied" in summary.line, summary.line
