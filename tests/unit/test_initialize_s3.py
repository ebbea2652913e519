"""``torchjob initialize`` against the real S3-compatible server (SeaweedFS, tests/s3.py), run
as the initialiser pod runs it (the CLI's ``main``, AWS_* in its environment): one
object and a prefix fetched into the target with the completion marker; a second run fetches
nothing; bad credentials, a missing bucket, a missing key and a bad URI each end with an
error naming the URI and the bucket, in the termination message the operator reads."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from tests.s3 import S3

from torchjob import contract
from torchjob.cli.main import main
from torchjob.rules import initializer as rules


def _initialize(
    uri: str, target: Path, env: dict[str, str], tmp: Path, *extra: str
) -> tuple[int, str, str]:
    """The command as the pod runs it (``torchjob initialize``, its environment ``env``):
    (exit code, what it printed, the termination message)."""
    log = tmp / "termination-log"
    log.write_text("")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(key)
        for key, value in {**env, contract.TERMINATION_LOG: str(log)}.items():
            mp.setenv(key, value)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["initialize", "--uri", uri, "--target", str(target), *extra])
    return code, out.getvalue() + err.getvalue(), log.read_text()


def test_an_object_and_a_prefix_are_fetched_once_with_the_marker(s3: S3, tmp_path: Path) -> None:
    fs = s3.server.fs()
    big = os.urandom(6 << 20)
    fs.pipe(f"{s3.bucket}/models/bert.bin", big)
    fs.pipe(f"{s3.bucket}/data/train/a.csv", b"x,y\n1,2\n")
    fs.pipe(f"{s3.bucket}/data/train/sub/b.csv", b"x,y\n3,4\n")
    fs.pipe(f"{s3.bucket}/data/trainer.txt", b"not under the prefix data/train/")
    env = s3.server.env()

    model = tmp_path / "vol" / "model"
    code, out, said = _initialize(s3.url("models", "bert.bin"), model, env, tmp_path)
    assert code == 0, out
    assert (model / "bert.bin").read_bytes() == big
    assert rules.fetched_bytes(contract.parse_termination_message(said).line) == len(big)  # type: ignore[union-attr]

    data = tmp_path / "vol" / "dataset"
    code, out, said = _initialize(s3.url("data", "train"), data, env, tmp_path)
    assert code == 0, out
    assert (data / "a.csv").read_bytes() == b"x,y\n1,2\n"
    assert (data / "sub" / "b.csv").read_bytes() == b"x,y\n3,4\n"
    assert not (data / "trainer.txt").exists() and not list(data.rglob("*.part"))
    marker = json.loads((data / rules.MARKER).read_text())
    assert marker == {"uri": s3.url("data", "train"), "bytes": 16, "files": 2}

    # Idempotent: the object changes in the bucket, the second run fetches nothing.
    fs.pipe(f"{s3.bucket}/data/train/a.csv", b"changed")
    code, out, said = _initialize(s3.url("data", "train"), data, env, tmp_path)
    assert code == 0 and "nothing fetched" in out, out
    assert said.startswith("torchjob: found 16 bytes in 2 files")
    assert (data / "a.csv").read_bytes() == b"x,y\n1,2\n"


def test_bad_credentials_a_missing_bucket_or_key_and_a_bad_uri_say_so(
    s3: S3, tmp_path: Path
) -> None:
    s3.server.fs().pipe(f"{s3.bucket}/data/a.csv", b"1")
    good = s3.server.env()
    target = tmp_path / "dataset"

    code, out, said = _initialize(
        s3.url("data"), target, {**good, "AWS_SECRET_ACCESS_KEY": "wrong"}, tmp_path
    )
    assert code == 1, out
    assert f"access to bucket '{s3.bucket}' denied" in said and s3.url("data") in said, said
    assert not (target / rules.MARKER).exists()

    code, out, said = _initialize("s3://no-such-bucket-tj/x", target, good, tmp_path)
    assert code == 1 and "bucket 'no-such-bucket-tj'" in said, said

    code, out, said = _initialize(s3.url("absent"), target, good, tmp_path)
    assert code == 1 and f"nothing at {s3.url('absent')}" in said, said
    assert f"bucket '{s3.bucket}'" in said

    code, out, said = _initialize("s3:/missing-slash/x", target, good, tmp_path)
    assert code == 2 and "bad initializer URI 's3:/missing-slash/x'" in said, said


def test_a_claim_is_copied_and_a_hub_repo_without_its_package_is_a_clear_error(
    tmp_path: Path,
) -> None:
    claim = tmp_path / "claim"
    (claim / "bert").mkdir(parents=True)
    (claim / "bert" / "config.json").write_text("{}")
    target = tmp_path / "model"
    code, out, said = _initialize(
        "pvc://models/bert", target, {}, tmp_path, "--source-root", str(claim)
    )
    assert code == 0 and (target / "config.json").read_text() == "{}", out
    assert said.startswith("torchjob: fetched 2 bytes in 1 files from pvc://models/bert")

    code, out, said = _initialize(
        "pvc://models/none", tmp_path / "x", {}, tmp_path, "--source-root", str(claim)
    )
    assert code == 1 and "does not exist in claim 'models'" in said, said

    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        code, out, said = _initialize("hf://org/repo", tmp_path / "hf", {}, tmp_path)
        assert code == 1 and "hf:// needs the huggingface_hub package" in said, said
