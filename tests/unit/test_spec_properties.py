"""Property: every spec the pydantic model accepts can be planned and built without an exception.

Hypothesis writes specs the way a careless user would (odd quantities, empty strings, huge
numbers, every optional block on or off), keeps those ``TorchJobSpec`` accepts, and runs the
planner and the pod builders on them under random observed states. An exception here would be
an operator that crashes in a loop on an accepted TorchJob (issue 7).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.unit.builders import T0

from torchjob.api.models import TorchJobSpec
from torchjob.rules import RestartRules, backoff_seconds
from torchjob_operator.resources.pods import probe_pod, worker_pod
from torchjob_operator.torchjob.observed import JobState, PodPhase, PodView, ProbeView
from torchjob_operator.torchjob.plan import JobView, plan

QUANTITIES = st.one_of(
    st.integers(-2, 2**40),
    st.floats(-1, 1e6, allow_nan=False),
    st.sampled_from(["500m", "0.5", "1", "8", "4Gi", "1e3", "-1", "lots", "", "1.5", "2k", "+3"]),
)
RESOURCE = st.sampled_from(["nvidia.com/gpu", "cpu", "memory"])
resources = st.fixed_dictionaries(
    {},
    optional={
        "limits": st.dictionaries(RESOURCE, QUANTITIES, max_size=3),
        "requests": st.dictionaries(RESOURCE, QUANTITIES, max_size=3),
    },
)
container = st.fixed_dictionaries(
    {"name": st.sampled_from(["trainer", "t", "side-car"]), "image": st.just("img")},
    optional={
        "resources": resources,
        "env": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["RANK", "A", "TORCHJOB_GENERATION", "X"])},
                optional={"value": st.text(max_size=5)},
            ),
            max_size=3,
        ),
        "volumeMounts": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["dshm", "data", "torchjob-checkpoint"]),
                    "mountPath": st.sampled_from(["/dev/shm", "/data", "/checkpoints", "/ck"]),
                }
            ),
            max_size=2,
        ),
        "ports": st.lists(
            st.fixed_dictionaries({"containerPort": st.sampled_from([29500, 8080])}), max_size=2
        ),
        "terminationMessagePath": st.sampled_from(["/dev/termination-log", "/tmp/x"]),
    },
)
pod_spec = st.fixed_dictionaries(
    {"containers": st.lists(container, min_size=1, max_size=2)},
    optional={
        "restartPolicy": st.sampled_from(["Never", "OnFailure", "Always"]),
        "hostname": st.just("h"),
        "schedulerName": st.sampled_from(["volcano", "default-scheduler"]),
        "priorityClassName": st.sampled_from(["high", "low"]),
        "terminationGracePeriodSeconds": st.integers(0, 10**6),
        "serviceAccountName": st.just("sa"),
        "volumes": st.lists(
            st.fixed_dictionaries(
                {"name": st.sampled_from(["data", "dshm"]), "emptyDir": st.just({})}
            ),
            max_size=2,
        ),
    },
)
template = st.fixed_dictionaries(
    {"spec": pod_spec},
    optional={
        "metadata": st.fixed_dictionaries(
            {},
            optional={
                "labels": st.dictionaries(
                    st.sampled_from(["app", "torchjob.io/role", "kueue.x-k8s.io/queue-name"]),
                    st.sampled_from(["a", "team-a"]),
                    max_size=2,
                ),
                "annotations": st.dictionaries(st.just("a"), st.text(max_size=3), max_size=1),
            },
        )
    },
)
BIG = st.one_of(
    st.integers(0, 12),
    st.integers(-1, 2**33),
    st.sampled_from([2**31 - 1, 2**31, 2**63 - 1, 2**63]),
)
spec_dicts = st.fixed_dictionaries(
    {"replicas": st.one_of(st.integers(1, 12), BIG), "template": template},
    optional={
        "elastic": st.fixed_dictionaries(
            {"minReplicas": BIG, "maxReplicas": BIG},
            optional={"scaleDownAfterSeconds": BIG, "scaleUpCooldownSeconds": BIG},
        ),
        "nprocPerNode": st.one_of(BIG, st.sampled_from(["gpu", "auto", "lots"])),
        "backend": st.sampled_from(["auto", "nccl", "gloo"]),
        "membershipPolicy": st.sampled_from(["RecreateGroup", "KeepSurvivors"]),
        "failurePolicy": st.fixed_dictionaries(
            {},
            optional={
                "maxRestarts": BIG,
                "permanentExitCodes": st.lists(st.integers(-1, 300), max_size=3),
                "retryableExitCodes": st.lists(st.integers(-1, 300), max_size=3),
                "backoff": st.fixed_dictionaries(
                    {},
                    optional={
                        "initialSeconds": BIG,
                        "maxSeconds": BIG,
                        "factor": st.floats(0, 1e308, allow_nan=False),
                    },
                ),
            },
        ),
        "runPolicy": st.fixed_dictionaries(
            {},
            optional={
                "suspend": st.booleans(),
                "activeDeadlineSeconds": BIG,
                "ttlSecondsAfterFinished": BIG,
                "cleanPodPolicy": st.sampled_from(["None", "Running", "All"]),
            },
        ),
        "checkpoint": st.fixed_dictionaries(
            {},
            optional={
                "path": st.sampled_from(["", "/ck", "s3://b/x"]),
                "pvc": st.fixed_dictionaries(
                    {"claimName": st.sampled_from(["", "ck", "Bad_Name", "a.b"])},
                    optional={"mountPath": st.sampled_from(["/checkpoints", "/dev/shm", "x", "/"])},
                ),
            },
        ),
        "scheduling": st.fixed_dictionaries(
            {},
            optional={
                "schedulerName": st.sampled_from(["volcano", "", "Bad Name"]),
                "priorityClassName": st.sampled_from(["high", "", "UPPER"]),
                "queueName": st.sampled_from(["team-a", "", "bad value!", "x" * 64]),
            },
        ),
    },
)


def _accepted(body: dict[str, Any]) -> TorchJobSpec:
    try:
        return TorchJobSpec.model_validate(body)
    except ValidationError:
        assume(False)
        raise  # unreachable: assume(False) raises


pods = st.lists(
    st.builds(
        PodView,
        name=st.just("p"),
        index=st.integers(0, 20),
        generation=st.integers(0, 3),
        phase=st.sampled_from(list(PodPhase)),
        ready=st.booleans(),
        deleting=st.booleans(),
        scheduled=st.booleans(),
        exit_code=st.one_of(st.none(), st.integers(-1, 300)),
        disruption=st.one_of(st.none(), st.just("PreemptionByScheduler")),
        finished_at=st.one_of(st.none(), st.just(T0)),
        unschedulable_since=st.one_of(st.none(), st.just(T0 - timedelta(hours=1))),
        peer_failure=st.booleans(),
    ),
    max_size=6,
)
statuses = st.fixed_dictionaries(
    {},
    optional={
        "phase": st.sampled_from(["Pending", "Running", "Restarting", "Starting", "Suspended"]),
        "currentGeneration": st.integers(0, 3),
        "replicas": st.integers(0, 12),
        "createdGeneration": st.integers(0, 3),
        "restarts": st.integers(0, 20_000),
        "specReplicas": st.integers(1, 20),
        "startTime": st.just("2025-12-31T00:00:00Z"),
        "restartAfter": st.just("2026-01-01T00:00:05Z"),
    },
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(body=spec_dicts, observed=pods, status=statuses)
def test_plan_and_builders_never_raise_on_an_accepted_spec(
    body: dict[str, Any], observed: list[PodView], status: dict[str, Any]
) -> None:
    spec = _accepted(body)
    observed = [PodView(**{**p.__dict__, "name": f"tj-worker-{p.index}"}) for p in observed]
    view = JobView(
        name="tj",
        namespace="ns",
        spec=spec,
        state=JobState.from_status(status),
        metadata_generation=1,
    )
    probes = [ProbeView(name="tj-probe-0", scheduled=True)]
    decided = plan(view, observed, T0, probes)
    if decided.create is not None:
        # The pods differ only by index: the first and the last one (up to 9999) stand for all.
        indices = sorted(decided.create.indices)
        for i in {indices[0], indices[-1]} if indices else ():
            pod = worker_pod(
                name="tj",
                namespace="ns",
                uid="u",
                spec=spec,
                index=i,
                generation=decided.create.generation,
                replicas=decided.create.replicas,
            )
            assert pod["spec"]["restartPolicy"] == "Never"
    for i in (*decided.create_probes, 0):
        probe_pod(name="tj", namespace="ns", uid="u", spec=spec, index=i)
    for n in (1, 2, 1025, 10_000, 10**6):
        assert (
            0
            <= backoff_seconds(n, RestartRules.of(spec.failure_policy))
            <= spec.failure_policy.backoff.max_seconds
        )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(body=spec_dicts)
def test_gpu_count_of_an_accepted_spec_is_a_whole_number(body: dict[str, Any]) -> None:
    spec = _accepted(body)
    gpus = spec.gpus_per_pod()
    assert isinstance(gpus, int) and gpus >= 0
    assert 1 <= spec.resolved_nproc_per_node() <= 2**40


def test_backoff_never_overflows() -> None:
    """Issue 7: restart 1025 of a job with the default factor 2 raised OverflowError (2.0**1024)."""
    policy = RestartRules.of(
        TorchJobSpec.model_validate(
            {
                "replicas": 1,
                "failurePolicy": {"maxRestarts": 10_000},
                "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
            }
        ).failure_policy
    )
    assert backoff_seconds(1025, policy) == 300.0
    assert backoff_seconds(10_000, policy) == 300.0
    assert [backoff_seconds(n, policy) for n in (1, 2, 3)] == [10.0, 20.0, 40.0]
