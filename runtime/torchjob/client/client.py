"""``TorchJobClient``: the Python SDK for TorchJobs on a cluster.

Built on the official ``kubernetes`` client (``CustomObjectsApi`` for the
TorchJob resource, ``CoreV1Api`` for its pods and their logs). The CLI's
``submit``/``get``/``logs``/``delete`` are thin wrappers of these methods.
Every Kubernetes exception is wrapped in an error of
:mod:`torchjob.client.errors`, so callers handle one family of errors.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import queue
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from torchjob import contract
from torchjob.api.models import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    TERMINAL_PHASES,
    VERSION,
    RuntimeKind,
    RuntimeRef,
)
from torchjob.api.runtimes import PLURALS as RUNTIME_PLURALS
from torchjob.client.errors import (
    KubeconfigError,
    MissingClientDependency,
    TorchJobClientError,
    WaitTimeout,
    api_error,
)
from torchjob.client.logs import LogLine, PodStream, finish_follow, has_started, pod_index, snapshot
from torchjob.client.manifest import Manifest, check_manifest
from torchjob.client.manifest import job_dict as _job_dict
from torchjob.client.manifest import raw_job as _raw
from torchjob.client.manifest import source_of as _source
from torchjob.client.runtimes import with_runtime
from torchjob.client.table import TABLE_ACCEPT, JobTable, fallback_table, server_table

_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class TorchJobClient:
    """Create, inspect, scale, follow and delete TorchJobs.

    Credentials come from ``kubeconfig`` (default: ``$KUBECONFIG`` or
    ``~/.kube/config``) and ``context``; inside a pod, from its service
    account. ``namespace`` defaults to the context's namespace, else
    ``default``. A :class:`KubeconfigError` says what was looked for when
    nothing is found.
    """

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> None:
        try:
            from kubernetes import client as k8s
        except ModuleNotFoundError as err:
            raise MissingClientDependency(
                "the torchjob client talks to the cluster through the kubernetes package, "
                "which is not installed here: pip install 'torchjob[client]'"
            ) from err

        configuration = k8s.Configuration()
        ctx_namespace = self._load_config(configuration, kubeconfig, context)
        self.namespace: str = namespace or ctx_namespace or "default"
        # Typed as Any: the generated client's signatures differ across its
        # supported major versions, and we only use their stable surface.
        self.api_client: Any = k8s.ApiClient(configuration)
        self.custom: Any = k8s.CustomObjectsApi(self.api_client)

    @functools.cached_property
    def core(self) -> Any:
        """``CoreV1Api`` (pods, logs), made on first use: importing it builds the generated
        client's ~270 pydantic models, about 2-3 s of CPU that ``get``, ``submit``, ``scale``
        and ``delete`` (custom objects only) never need."""
        from kubernetes import client as k8s

        return k8s.CoreV1Api(self.api_client)

    @staticmethod
    def _load_config(configuration: Any, kubeconfig: Any, context: str | None) -> str | None:
        from kubernetes import config as _kcfg
        from kubernetes.config.config_exception import ConfigException

        kcfg: Any = _kcfg  # untyped module

        explicit = kubeconfig is not None
        path = str(kubeconfig) if explicit else None
        if path is None:
            env = os.environ.get("KUBECONFIG", "")
            candidates = [p for p in env.split(os.pathsep) if p] or [
                str(Path.home() / ".kube" / "config")
            ]
            existing = [p for p in candidates if Path(p).is_file()]
            path = existing[0] if existing else None
        if path is not None:
            if not Path(path).is_file():
                raise KubeconfigError(f"kubeconfig {path}: no such file")
            try:
                kcfg.load_kube_config(
                    config_file=path, context=context, client_configuration=configuration
                )
                contexts, active = kcfg.list_kube_config_contexts(config_file=path)
            except ConfigException as e:
                raise KubeconfigError(f"kubeconfig {path}: {e}") from e
            chosen = active
            if context is not None:
                chosen = next((c for c in contexts if c.get("name") == context), active)
            ns = (chosen or {}).get("context", {}).get("namespace")
            return str(ns) if ns else None
        try:
            kcfg.load_incluster_config(client_configuration=configuration)
        except ConfigException as e:
            raise KubeconfigError(
                "no Kubernetes credentials found: no kubeconfig at $KUBECONFIG or "
                "~/.kube/config, and not running in a pod with a service account. "
                "Pass --kubeconfig (or kubeconfig=...), or set KUBECONFIG."
            ) from e
        with contextlib.suppress(OSError):
            return _SA_NAMESPACE.read_text().strip() or None
        return None

    # --- TorchJob objects --------------------------------------------------------
    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def create(
        self, job: Any, *, namespace: str | None = None, runtime: str | None = None
    ) -> dict[str, Any]:
        """Create a TorchJob from a dict, a ``torchjob.api.TorchJob``, a Manifest or a YAML path.

        ``runtime`` names the runtime blueprint it starts from (``spec.runtimeRef``):
        ``"torch-gpu"`` (a ClusterTorchRuntime) or ``"TorchRuntime/team-gpu"`` (one of the
        job's namespace). A job with a blueprint is checked merged over it before it is sent
        (a ``ManifestError`` names the field and the side it came from)."""
        raw = _raw(job)
        ns = namespace or (raw.get("metadata") or {}).get("namespace") or self.namespace
        named = (raw.get("spec") or {}).get("runtimeRef") is not None
        if runtime is not None or (named and not isinstance(job, Manifest)):
            raw = with_runtime(raw, runtime)
            check_manifest(raw, _source(job), lambda ref, _ns: self.get_runtime(ref, ns))
            body = raw
        else:
            body = _job_dict(job)
        body.setdefault("apiVersion", API_VERSION)
        body.setdefault("kind", KIND)
        meta = body.setdefault("metadata", {})
        meta["namespace"] = ns
        name = meta.get("name", "?")
        try:
            created: dict[str, Any] = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, body
            )
        except Exception as e:
            raise api_error(e, f"TorchJob {ns}/{name} create") from e
        return created

    def get_runtime(
        self, ref: RuntimeRef | str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        """The runtime blueprint ``ref`` names (a ``RuntimeRef``, or ``"torch-gpu"`` /
        ``"TorchRuntime/team-gpu"``); None when it does not exist."""
        from torchjob.client.runtimes import parse_runtime

        ref = parse_runtime(ref) if isinstance(ref, str) else ref
        plural = RUNTIME_PLURALS[ref.kind]
        try:
            if ref.kind is RuntimeKind.CLUSTER_TORCH_RUNTIME:
                obj = self.custom.get_cluster_custom_object(GROUP, VERSION, plural, ref.name)
            else:
                ns = self._ns(namespace)
                obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, plural, ref.name)
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise api_error(e, ref.describe()) from e
        return dict(obj)

    def get(self, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        """The TorchJob ``name`` as the API server has it (spec and status)."""
        ns = self._ns(namespace)
        try:
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name
            )
        except Exception as e:
            raise api_error(e, f"TorchJob {ns}/{name}") from e
        return obj

    def list(
        self, *, namespace: str | None = None, label_selector: str | None = None
    ) -> builtins.list[dict[str, Any]]:
        """TorchJobs of a namespace, optionally filtered by labels."""
        ns = self._ns(namespace)
        try:
            kwargs: dict[str, Any] = {}
            if label_selector:
                kwargs["label_selector"] = label_selector
            result = self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, **kwargs)
        except Exception as e:
            raise api_error(e, f"TorchJobs in {ns}") from e
        items: builtins.list[dict[str, Any]] = result.get("items", [])
        return items

    def delete(
        self, name: str, *, namespace: str | None = None, propagation: str = "Foreground"
    ) -> None:
        """Delete the TorchJob; its pods go with it (owner references)."""
        ns = self._ns(namespace)
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, propagation_policy=propagation
            )
        except Exception as e:
            raise api_error(e, f"TorchJob {ns}/{name} delete") from e

    def scale(self, name: str, replicas: int, *, namespace: str | None = None) -> dict[str, Any]:
        """Set ``spec.replicas`` through the scale subresource (what ``kubectl scale`` does)."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        ns = self._ns(namespace)
        try:
            scaled: dict[str, Any] = self.custom.patch_namespaced_custom_object_scale(
                GROUP, VERSION, ns, PLURAL, name, {"spec": {"replicas": replicas}}
            )
        except Exception as e:
            raise api_error(e, f"TorchJob {ns}/{name} scale") from e
        return scaled

    def table(self, name: str | None = None, *, namespace: str | None = None) -> JobTable:
        """Rows as ``kubectl get tj`` shows them: the server renders the CRD's printer columns."""
        ns = self._ns(namespace)
        headers = {"Accept": TABLE_ACCEPT}
        try:
            if name is None:
                data = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, _headers=headers
                )
            else:
                data = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, name, _headers=headers
                )
        except TypeError:  # an older kubernetes client without _headers
            objs = [self.get(name, namespace=ns)] if name else self.list(namespace=ns)
            return fallback_table(objs)
        except Exception as e:
            raise api_error(e, f"TorchJob {ns}/{name}" if name else f"TorchJobs in {ns}") from e
        if not isinstance(data, Mapping) or data.get("kind") != "Table":
            objs = [data] if name else list(data.get("items", []))
            return fallback_table(objs)
        return server_table(data)

    # --- waiting -----------------------------------------------------------------
    def wait_for_phase(
        self,
        name: str,
        phases: str | Iterable[str],
        *,
        namespace: str | None = None,
        timeout_s: float = 300.0,
        poll_interval_s: float = 1.0,
    ) -> dict[str, Any]:
        """Block until ``status.phase`` is one of ``phases``; return the TorchJob.

        Raises :class:`TorchJobClientError` when the job reaches a terminal
        phase that is not wanted (it can never get there), and
        :class:`WaitTimeout`, with the last status seen, after ``timeout_s``.
        """
        wanted = {phases} if isinstance(phases, str) else set(phases)
        ns = self._ns(namespace)
        deadline = time.monotonic() + timeout_s
        last: dict[str, Any] = {}
        from kubernetes import watch as _watch

        watch: Any = _watch  # untyped module
        while True:
            obj = self.get(name, namespace=ns)
            last = obj
            phase = (obj.get("status") or {}).get("phase")
            if phase in wanted:
                return obj
            if phase in TERMINAL_PHASES:
                raise TorchJobClientError(
                    f"TorchJob {ns}/{name} reached phase {phase}, not {sorted(wanted)}: "
                    f"{_status_summary(obj)}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(
                    f"TorchJob {ns}/{name} not in {sorted(wanted)} after {timeout_s:.0f}s: "
                    f"{_status_summary(last)}"
                )
            # Block on a watch of this one object rather than sleeping; re-read on any event.
            w: Any = watch.Watch()
            try:
                for _event in w.stream(
                    self.custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    ns,
                    PLURAL,
                    field_selector=f"metadata.name={name}",
                    resource_version=obj.get("metadata", {}).get("resourceVersion"),
                    timeout_seconds=max(1, int(min(remaining, 30))),
                ):
                    break
            except Exception:
                # A watch that cannot be opened (expired resourceVersion, proxy) degrades to polling.
                time.sleep(min(poll_interval_s, max(0.0, deadline - time.monotonic())))
            finally:
                w.stop()

    # --- pods and logs -----------------------------------------------------------
    def pods(self, name: str, *, namespace: str | None = None) -> builtins.list[Any]:
        """The job's worker pods (``V1Pod``), ordered by pod index then creation time."""
        ns = self._ns(namespace)
        try:
            result = self.core.list_namespaced_pod(
                ns, label_selector=f"{contract.LABEL_JOB_NAME}={name}"
            )
        except Exception as e:
            raise api_error(e, f"pods of TorchJob {ns}/{name}") from e
        return sorted(
            result.items, key=lambda p: (pod_index(p), str(p.metadata.creation_timestamp))
        )

    def logs(
        self,
        name: str,
        *,
        namespace: str | None = None,
        follow: bool = False,
        container: str | None = None,
        poll_interval_s: float = 1.0,
        stop: Callable[[], bool] | None = None,
    ) -> Iterator[LogLine]:
        """Lines of all the job's worker pods, interleaved.

        Without ``follow``: every pod's log so far, merged in timestamp order.
        With ``follow``: streams each pod as it starts, including pods created
        later (a restarted generation), until the job reaches a terminal phase
        (then every pod's remaining lines are read and it returns), or ``stop()``
        returns true. Raises :class:`TorchJobNotFound` when the job does not exist.
        """
        ns = self._ns(namespace)
        self.get(name, namespace=ns)  # a missing job is an error, not an empty log
        if not follow:
            yield from snapshot(self.core, self.pods(name, namespace=ns), ns, container)
            return
        lines: queue.Queue[LogLine] = queue.Queue()
        streams: dict[str, PodStream] = {}
        try:
            while True:
                phase = (self.get(name, namespace=ns).get("status") or {}).get("phase")
                pods = self.pods(name, namespace=ns)
                if phase in TERMINAL_PHASES:
                    # A kubelet ends a stream when its container exits, kwok never does:
                    # hang up, then read what each stream had not delivered yet.
                    yield from finish_follow(self.core, pods, streams, ns, container, lines)
                    return
                for pod in pods:
                    uid = pod.metadata.uid
                    if uid in streams or not has_started(pod):
                        continue
                    streams[uid] = PodStream(self.core, pod, ns, container, lines)
                deadline = time.monotonic() + poll_interval_s
                while True:
                    try:
                        yield lines.get(timeout=max(0.0, deadline - time.monotonic()))
                    except queue.Empty:
                        break
                if stop is not None and stop():
                    return
        finally:
            for stream in streams.values():
                stream.close()


def _status_summary(obj: Mapping[str, Any]) -> str:
    status = obj.get("status") or {}
    parts = [f"phase={status.get('phase')!r}"]
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True":
            parts.append(
                f"{cond.get('type')}: {cond.get('reason')} {cond.get('message', '')}".strip()
            )
    return "; ".join(parts)
