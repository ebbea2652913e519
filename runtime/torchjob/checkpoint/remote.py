"""What checkpoint storage does on an object store that a local path never needs: retries of
transient failures, and an access check at start-up that names the bucket.

Retries: every remote call of ``CheckpointStorage`` (an upload, a read, a listing) is tried
again after a transient failure (a refused or reset connection, a timeout, a 5xx), up to
``Retry.attempts`` times with an exponential wait. The client library retries too (botocore:
``AWS_MAX_ATTEMPTS``, ``AWS_RETRY_MODE``; s3fs its own few); these retries ride out an
outage longer than theirs, such as an object store restarting. Every call retried is
idempotent: an upload rewrites the same key, and the commit marker is still written last.
Permanent failures (bad credentials, a missing bucket or object, an invalid request) are not
retried.

The access check: before a run reads or writes anything, the bucket is listed once (one
object at most), so bad credentials or a missing bucket fail at start-up with a
``CheckpointError`` that names the bucket, not at the first save, minutes into training.
Checkpoints never create a bucket.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from torchjob.checkpoint.errors import CheckpointError

log = logging.getLogger(__name__)
T = TypeVar("T")

LOCAL_PROTOCOLS = frozenset({"file", "local", "memory"})
"""Filesystems without buckets or a network: no retries, no access check."""

_PERMANENT = (
    PermissionError,
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    CheckpointError,
)
_TRANSPORT_MODULES = ("botocore", "aiobotocore", "aiohttp", "urllib3", "requests", "google")


@dataclass(frozen=True)
class Retry:
    """How often a remote call is tried, and the wait before the first retry (doubling)."""

    attempts: int = 5
    wait_s: float = 0.5
    max_wait_s: float = 8.0


def is_transient(err: BaseException) -> bool:
    """Worth trying again: the network or the server failed, not the request."""
    if isinstance(err, _PERMANENT):
        return False
    if isinstance(err, OSError):
        # s3fs maps an invalid request (a bad argument, a malformed name) to EINVAL.
        return err.errno not in (errno.EINVAL, errno.ENAMETOOLONG, errno.EPERM, errno.EMSGSIZE)
    if isinstance(err, TimeoutError | ConnectionError):
        return True
    return type(err).__module__.split(".")[0] in _TRANSPORT_MODULES


def with_retries(what: str, policy: Retry, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, tried again after transient failures; the last failure is raised."""
    wait = policy.wait_s
    for attempt in range(1, policy.attempts + 1):
        try:
            return fn(*args)
        except Exception as err:
            if attempt == policy.attempts or not is_transient(err):
                raise
            log.warning(
                "checkpoint storage: %s failed (attempt %d of %d, retrying in %.1fs): %s",
                what,
                attempt,
                policy.attempts,
                wait,
                err,
            )
            time.sleep(wait)
            wait = min(wait * 2, policy.max_wait_s)
    raise AssertionError("unreachable")


def bucket_of(root: str) -> str:
    """The bucket (or container) of an object store path: its first component."""
    return root.lstrip("/").split("/", 1)[0]


_checked: set[tuple[str, str]] = set()
_checked_lock = threading.Lock()


def check_access(fs: Any, protocol: str, url: str, root: str, policy: Retry) -> None:
    """Raise a ``CheckpointError`` naming the bucket unless it exists and the credentials in
    use may list it. Once per process and bucket (later storages of a run skip it)."""
    bucket = bucket_of(root)
    key = (protocol, bucket)
    with _checked_lock:
        if key in _checked:
            return
    try:
        if hasattr(fs, "call_s3"):  # s3fs: one ListObjectsV2 of at most one key
            with_retries(
                f"listing bucket {bucket}",
                policy,
                fs.call_s3,
                "list_objects_v2",
                {"Bucket": bucket, "MaxKeys": 1},
            )
        else:
            with_retries(f"listing bucket {bucket}", policy, fs.ls, bucket, False)
    except PermissionError as err:
        raise CheckpointError(
            url,
            f"access to bucket '{bucket}' denied with the credentials in use ({err}); check "
            "the storage credentials (for S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or the pod's role) and the bucket's policy",
        ) from err
    except FileNotFoundError as err:
        raise CheckpointError(
            url,
            f"bucket '{bucket}' does not exist ({err}); create it first (checkpoints never "
            "create a bucket), or fix the bucket name or the endpoint (for S3: "
            "AWS_ENDPOINT_URL)",
        ) from err
    except Exception as err:
        raise CheckpointError(url, f"cannot reach bucket '{bucket}': {err!r}") from err
    with _checked_lock:
        _checked.add(key)


def forget_checked() -> None:
    """Check every bucket again (tests change credentials within one process)."""
    with _checked_lock:
        _checked.clear()
