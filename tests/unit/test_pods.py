"""The worker pod and Service builders."""

from __future__ import annotations

from torchjob import contract
from torchjob.api import TorchJobSpec
from torchjob_operator.resources.pods import headless_service, worker_pod


def build(**spec_extra: object) -> dict:
    spec = {
        "replicas": 4,
        "nprocPerNode": "gpu",
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "containers": [
                    {
                        "name": "t",
                        "image": "i",
                        "env": [{"name": "RANK", "value": "99"}, {"name": "MINE", "value": "1"}],
                        "resources": {"limits": {"nvidia.com/gpu": 8}},
                    }
                ]
            },
        },
        "scheduling": {"queueName": "q", "priorityClassName": "low"},
        "checkpoint": {"pvc": {"claimName": "ckpt"}},
    }
    spec.update(spec_extra)
    return worker_pod(
        name="job",
        namespace="ns",
        uid="u1",
        spec=TorchJobSpec.model_validate(spec),
        index=2,
        generation=5,
        replicas=4,
    )


def env(pod: dict) -> dict:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_contract_env_is_complete_and_wins_over_the_template() -> None:
    e = env(build())
    assert e["RANK"] == "2"  # node rank, not the template's stale 99
    assert e["MINE"] == "1"
    assert e["WORLD_SIZE"] == "32"
    assert e["LOCAL_WORLD_SIZE"] == "8"
    assert e[contract.GENERATION] == "5"
    assert e[contract.CHECKPOINT_PATH] == "/checkpoints"
    assert e["MASTER_ADDR"] == "job-worker-0.job.ns.svc"
    assert e["PET_NODE_RANK"] == "2"
    parsed = contract.PodEnv.from_env({k: v for k, v in e.items() if v is not None})
    assert parsed is not None and parsed.world_size == 32 and parsed.pod_index == 2


def test_gpu_pod_defaults() -> None:
    pod = build()
    spec = pod["spec"]
    c = spec["containers"][0]
    assert (
        c["resources"]["requests"]["nvidia.com/gpu"]
        == c["resources"]["limits"]["nvidia.com/gpu"]
        == "8"
    )
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in spec["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert spec["terminationGracePeriodSeconds"] == 120
    assert spec["restartPolicy"] == "Never"
    assert (spec["hostname"], spec["subdomain"]) == ("job-worker-2", "job")
    assert spec["priorityClassName"] == "low"
    labels = pod["metadata"]["labels"]
    assert labels["team"] == "a" and labels[contract.KUEUE_QUEUE_LABEL] == "q"
    assert labels[contract.LABEL_GENERATION] == "5"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u1"


def test_headless_service_publishes_not_ready_addresses() -> None:
    svc = headless_service(name="job", namespace="ns", uid="u1")
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_termination_message_defaults_and_the_path_reaches_the_runtime() -> None:
    c = build()["spec"]["containers"][0]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert env(build())[contract.TERMINATION_LOG] == contract.DEFAULT_TERMINATION_LOG

    template = {
        "spec": {
            "containers": [
                {
                    "name": "t",
                    "image": "i",
                    "terminationMessagePath": "/tmp/why",
                    "terminationMessagePolicy": "File",
                    "env": [{"name": contract.TERMINATION_LOG, "value": "/stale"}],
                }
            ]
        }
    }
    pod = build(template=template, nprocPerNode=1, checkpoint=None)
    c = pod["spec"]["containers"][0]
    assert c["terminationMessagePolicy"] == "File", "the user's policy is kept"
    names = [e["name"] for e in c["env"]]
    assert names.count(contract.TERMINATION_LOG) == 1
    assert env(pod)[contract.TERMINATION_LOG] == "/tmp/why"


def test_only_a_joiner_gets_the_readiness_probe_on_its_ready_port() -> None:
    spec = TorchJobSpec.model_validate(
        {"replicas": 2, "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}
    )
    kw = {"name": "job", "namespace": "ns", "uid": "u1", "spec": spec, "index": 1}
    joiner = worker_pod(**kw, generation=3, replicas=2, joiner=True)  # type: ignore[arg-type]
    probe = joiner["spec"]["containers"][0]["readinessProbe"]
    # A TCP connect the kubelet makes itself: no process started in the container each second.
    assert probe["tcpSocket"] == {"port": contract.JOINER_READY_PORT} and "exec" not in probe
    member = worker_pod(**kw, generation=3, replicas=2)  # type: ignore[arg-type]
    assert "readinessProbe" not in member["spec"]["containers"][0]


def test_workers_spread_over_nodes_unless_the_template_says_otherwise() -> None:
    spread = build()["spec"]["topologySpreadConstraints"]
    assert spread == [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {
                "matchLabels": {contract.LABEL_JOB_NAME: "job", contract.LABEL_ROLE: "worker"}
            },
        }
    ]
    own = {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    for mine in ([own], []):  # the template's own, or none at all
        template = {
            "spec": {"containers": [{"name": "t", "image": "i"}], "topologySpreadConstraints": mine}
        }
        assert build(template=template)["spec"]["topologySpreadConstraints"] == mine
