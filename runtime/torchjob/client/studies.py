"""TorchTune studies on the cluster: create, read, follow, delete (the ``torchjob tune`` CLI
and ``torchjob.tune.submit``/``attach`` use it). No torch: the CLI imports it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from torchjob.api.models import GROUP, VERSION
from torchjob.api.torchtune import PLURAL, TorchTune
from torchjob.client.client import TorchJobClient
from torchjob.client.errors import TorchJobInvalid, TorchJobNotFound, WaitTimeout, api_error

FINISHED = ("Succeeded", "Failed")


def validate_study(body: Mapping[str, Any]) -> None:
    """Reject what the API server (or the operator) would, naming the field."""
    try:
        TorchTune.model_validate(dict(body))
    except ValidationError as err:
        e = err.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise TorchJobInvalid(f"TorchTune {where}: {e['msg']}", where, e["msg"]) from None


class TuneClient:
    """TorchTunes through the same credentials as :class:`TorchJobClient`."""

    def __init__(self, jobs: TorchJobClient | None = None, **kwargs: Any) -> None:
        self.jobs = jobs or TorchJobClient(**kwargs)
        self.custom = self.jobs.custom
        self.namespace = self.jobs.namespace

    def create(self, body: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        validate_study(body)
        ns = namespace or (body.get("metadata") or {}).get("namespace") or self.namespace
        try:
            obj: dict[str, Any] = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, dict(body)
            )
        except Exception as e:
            raise api_error(
                e, f"create TorchTune {(body.get('metadata') or {}).get('name')}"
            ) from e
        return obj

    def get(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace or self.namespace, PLURAL, name
            )
        except Exception as e:
            raise api_error(e, f"get TorchTune {name}") from e
        return obj

    def list(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        try:
            items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, namespace or self.namespace, PLURAL
            )["items"]
        except Exception as e:
            raise api_error(e, "list TorchTunes") from e
        return items

    def delete(self, name: str, *, namespace: str | None = None) -> None:
        """Delete the study; its trial TorchJobs go with it (ownerReferences)."""
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace or self.namespace,
                PLURAL,
                name,
                propagation_policy="Background",
            )
        except Exception as e:
            raise api_error(e, f"delete TorchTune {name}") from e

    def wait(
        self,
        name: str,
        *,
        namespace: str | None = None,
        timeout_s: float | None = None,
        poll_interval_s: float = 2.0,
    ) -> dict[str, Any]:
        """Until the study is Succeeded or Failed; returns the object."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            obj = self.get(name, namespace=namespace)
            if (obj.get("status") or {}).get("phase") in FINISHED:
                return obj
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(f"TorchTune {name} did not finish within {timeout_s:.0f}s")
            time.sleep(poll_interval_s)


def summary_rows(obj: Mapping[str, Any]) -> list[list[str]]:
    """One row per trial: number, TorchJob, state, value, step, params."""
    rows = []
    for t in (obj.get("status") or {}).get("trials") or []:
        params = ", ".join(f"{k}={v}" for k, v in (t.get("params") or {}).items())
        value = t.get("value")
        rows.append(
            [
                str(t.get("number")),
                str(t.get("name")),
                str(t.get("state")),
                "" if value is None else f"{value:.6g}",
                str(t.get("step") or ""),
                params,
            ]
        )
    return rows


__all__ = ["TorchJobNotFound", "TuneClient", "summary_rows", "validate_study"]
