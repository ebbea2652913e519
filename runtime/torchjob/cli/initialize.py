"""``torchjob initialize --uri URI --target DIR``: what an initialiser pod runs
(``spec.initializers``). It fetches a dataset or a model once into the volume the workers
mount, and writes a completion marker last.

* ``s3://bucket/key-or-prefix``: one object, or every object under the prefix, through
  fsspec (s3fs); the endpoint and credentials come from the environment (``AWS_*``, the
  Secret of ``secretName``). Transient failures are retried (``torchjob.checkpoint.remote``'s
  policy); bad credentials or a missing bucket fail at once with the bucket's name.
* ``hf://org/repo[@revision]``: a Hugging Face repository (``huggingface_hub``, network
  permitting; ``HF_TOKEN`` from the Secret); without the package, a clear error.
* ``pvc://claim/path``: a copy from the claim, which the pod mounts read-only at
  ``torchjob.rules.initializer.SOURCE_ROOT``.

Idempotent: a target that holds the marker of the same URI is not fetched again (a second
run, a re-created pod, another job on the same volume). The outcome is one line on stdout and
in the termination message (``rules.summary`` on success, the error otherwise), which the
operator reads into ``status.initializers``. Exit codes: 0 done, 1 failed, 2 bad URI.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchjob import contract
from torchjob.rules import initializer as rules


class InitializeError(Exception):
    """An initialiser cannot do its work; the message names the URI (and the bucket)."""


@dataclass(frozen=True)
class Fetched:
    bytes: int
    files: int
    cached: bool = False


def fetch(uri: str, target: str, *, source_root: str = rules.SOURCE_ROOT) -> Fetched:
    """Bring ``uri`` into the directory ``target`` once (see the module docstring)."""
    source = rules.parse_uri(uri)  # ValueError: a bad URI
    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    marker = root / rules.MARKER
    if marker.is_file():
        try:
            done = json.loads(marker.read_text())
        except ValueError:
            done = {}
        if done.get("uri") == uri:
            return Fetched(int(done.get("bytes", 0)), int(done.get("files", 0)), cached=True)
        _empty(root)  # another URI was fetched here: start clean
    if source.scheme == "s3":
        got = _from_s3(source, root)
    elif source.scheme == "hf":
        got = _from_hub(source, root)
    else:
        got = _from_claim(source, root, Path(source_root))
    tmp = root / f"{rules.MARKER}.tmp"
    tmp.write_text(json.dumps({"uri": uri, "bytes": got.bytes, "files": got.files}))
    os.replace(tmp, marker)  # last: a fetch cut short is fetched again
    return got


def _empty(root: Path) -> None:
    for child in root.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


class _Progress:
    """A line every few seconds while bytes arrive (``kubectl logs`` of the pod)."""

    def __init__(self, uri: str, total: int) -> None:
        self.uri, self.total, self.done, self.last = uri, total, 0, time.monotonic()

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self.last >= 5 or self.done == self.total:
            self.last = time.monotonic()
            print(f"{self.uri}: {self.done} of {self.total} bytes", flush=True)


def _from_s3(source: rules.Source, root: Path) -> Fetched:
    try:
        import fsspec

        fs: Any = fsspec.filesystem("s3", skip_instance_cache=True)
    except ImportError as err:
        raise InitializeError(
            f"{source.uri}: s3:// needs s3fs in the image (pip install 'torchjob[s3]'): {err}"
        ) from None
    from torchjob.checkpoint.remote import Retry, with_retries

    retry, bucket = Retry(), source.root
    prefix = f"{bucket}/{source.path}".rstrip("/")
    try:
        found: dict[str, Any] = with_retries(
            f"listing {source.uri}", retry, fs.find, prefix, None, False, True
        )
        files = {k: v for k, v in found.items() if v.get("type", "file") == "file"}
        if not files:
            raise InitializeError(
                f"nothing at {source.uri}: no object with that key or under that prefix in "
                f"bucket '{bucket}'"
            )
        progress = _Progress(source.uri, sum(int(v.get("size") or 0) for v in files.values()))
        for key, info in sorted(files.items()):
            rel = key[len(prefix) :].lstrip("/") or key.rsplit("/", 1)[-1]
            local = root / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            part = local.with_name(local.name + ".part")
            with_retries(f"downloading s3://{key}", retry, fs.get_file, key, str(part))
            os.replace(part, local)
            progress.add(int(info.get("size") or 0))
    except PermissionError as err:
        raise InitializeError(
            f"cannot read {source.uri}: access to bucket '{bucket}' denied with the credentials "
            f"in use ({err}); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the Secret "
            "of spec.initializers.*.secretName, and the bucket's policy"
        ) from err
    except FileNotFoundError as err:
        raise InitializeError(
            f"cannot read {source.uri}: bucket '{bucket}' does not exist ({err}); fix the "
            "bucket name or the endpoint (AWS_ENDPOINT_URL)"
        ) from err
    except InitializeError:
        raise
    except Exception as err:
        raise InitializeError(f"cannot read {source.uri} (bucket '{bucket}'): {err!r}") from err
    return Fetched(progress.total, len(files))


def _from_hub(source: rules.Source, root: Path) -> Fetched:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise InitializeError(
            f"{source.uri}: hf:// needs the huggingface_hub package in the image "
            "(pip install huggingface_hub)"
        ) from None
    try:
        snapshot_download(
            repo_id=source.root,
            revision=source.path or None,
            local_dir=str(root),
            token=os.environ.get("HF_TOKEN") or None,
        )
    except Exception as err:
        raise InitializeError(
            f"cannot download {source.uri} from the Hugging Face Hub: {err}"
        ) from err
    return _count(root)


def _from_claim(source: rules.Source, root: Path, mounted: Path) -> Fetched:
    path = mounted / source.path
    if not path.exists():
        raise InitializeError(
            f"nothing at {source.uri}: {source.path or '/'} does not exist in claim "
            f"'{source.root}' (mounted at {mounted})"
        )
    if path.is_dir():
        shutil.copytree(path, root, dirs_exist_ok=True)
    else:
        shutil.copy2(path, root / path.name)
    return _count(root)


def _count(root: Path) -> Fetched:
    sizes = [
        p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith(rules.MARKER) and ".cache" not in p.parts
    ]
    return Fetched(sum(sizes), len(sizes))


def _say(line: str) -> None:
    """The outcome, for the operator: the termination message (when the pod has one)."""
    path = os.environ.get(contract.TERMINATION_LOG)
    if path:
        with contextlib.suppress(OSError):
            Path(path).write_text(contract.termination_message(line))


def run(uri: str, target: str, source_root: str = rules.SOURCE_ROOT) -> int:
    """The command: fetch, then one line on stdout (or stderr) and in the termination log."""
    try:
        got = fetch(uri, target, source_root=source_root)
    except ValueError as err:
        _say(str(err))
        sys.stderr.write(f"error: {err}\n")
        return 2
    except (InitializeError, OSError) as err:
        _say(str(err))
        sys.stderr.write(f"error: {err}\n")
        return 1
    line = rules.summary(got.bytes, got.files, uri, cached=got.cached)
    if got.cached:
        line += f" (marker {rules.MARKER} in {target}: nothing fetched)"
    print(line, flush=True)
    _say(line)
    return 0
