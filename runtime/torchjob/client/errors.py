"""The SDK's own errors: Kubernetes client exceptions never leak out of ``torchjob.client``."""

from __future__ import annotations

import json
from typing import Any


class TorchJobClientError(RuntimeError):
    """Base of every error the SDK raises."""


class KubeconfigError(TorchJobClientError):
    """No usable cluster credentials (no kubeconfig, unknown context, not in a pod)."""


class MissingClientDependency(TorchJobClientError):
    """The ``kubernetes`` package, which the SDK talks to the cluster through, is not
    installed (``pip install 'torchjob[client]'``)."""


class TorchJobNotFound(TorchJobClientError):
    """The TorchJob (or its CRD) does not exist."""


class TorchJobAlreadyExists(TorchJobClientError):
    """A TorchJob with that name already exists in the namespace."""


class TorchJobInvalid(TorchJobClientError):
    """The API server rejected the TorchJob (HTTP 422): ``field`` and ``problem`` say why."""

    def __init__(self, message: str, field: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.field = field
        self.problem = problem or message


class WaitTimeout(TorchJobClientError):
    """A wait for a phase ran out of time; the message carries the last status seen."""


def api_error(e: Exception, what: str) -> TorchJobClientError:
    """A Kubernetes client exception as the SDK's error for it: 404, 409 and 422 (with the
    fields the server names) each have their own; ``what`` says what was asked for."""
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or type(e).__name__
    body = getattr(e, "body", None)
    detail = reason
    causes: list[dict[str, Any]] = []
    if isinstance(body, str | bytes) and body:
        try:
            parsed = json.loads(body)
            detail = parsed.get("message", reason)
            causes = [c for c in (parsed.get("details") or {}).get("causes") or [] if c]
        except (ValueError, AttributeError):
            detail = reason
    if status == 404:
        return TorchJobNotFound(f"{what}: not found ({detail})")
    if status == 409:
        return TorchJobAlreadyExists(f"{what}: already exists ({detail})")
    if status == 422:  # Invalid: the server's validation (OpenAPI schema, CEL) names the fields
        named = [(str(c.get("field", "")), str(c.get("message", ""))) for c in causes]
        field, problem = named[0] if named else ("", str(detail))
        if len(named) > 1:
            problem += "".join(f"; {f}: {m}" for f, m in named[1:])
        return TorchJobInvalid(f"{what}: {detail}", field, problem)
    return TorchJobClientError(f"{what}: {detail}" + (f" (HTTP {status})" if status else ""))
