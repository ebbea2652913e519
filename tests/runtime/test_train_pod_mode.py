"""fit() inside TorchJob pods: two "pods" (processes with the operator's env contract) form one group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.kube import scaled

from torchjob.contract import PodEnv
from torchjob.launch import free_port

_POD_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    import torchjob.train
    from torchjob.train import RunConfig

    def train_func():
        ctx = torchjob.train.get_context()
        with tempfile.TemporaryDirectory() as d:
            open(os.path.join(d, "who"), "w").write(str(ctx.get_world_rank()))
            torchjob.train.report(
                {"rank": ctx.get_world_rank(), "world": ctx.get_world_size(),
                 "node": ctx.get_node_rank(), "local": ctx.get_local_rank()},
                checkpoint=torchjob.train.Checkpoint.from_directory(d),
            )

    result = torchjob.train.TorchTrainer(train_func, run_config=RunConfig(progress=False)).fit()
    with result.checkpoint.as_directory() as d:
        who = open(os.path.join(d, "who")).read()
    print(json.dumps({
        "metrics": result.metrics, "path": result.path, "checkpoint": result.checkpoint.path,
        "who": who, "history": result.metrics_history,
        "best": [c.path for c, _ in result.best_checkpoints],
        "primary": torchjob.train.is_primary(),
    }))
    """
)


def test_two_pods_share_one_group_and_return_the_same_result(tmp_path: Path) -> None:
    storage = tmp_path / "job-storage"
    port = free_port()
    procs = []
    for index in range(2):
        pod = PodEnv(
            job_name="demo", namespace="ns", pod_index=index, replicas=2,
            nproc_per_node=2, generation=0, rdzv_host="127.0.0.1",
            rdzv_port=port, backend="gloo", checkpoint_path=str(storage),
        )  # fmt: skip
        env = {**os.environ, **pod.to_env()}
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", _POD_SCRIPT], env=env, stdout=subprocess.PIPE, text=True
            )
        )
    outputs = [p.communicate(timeout=scaled(180))[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    pod0 = json.loads(outputs[0].strip().splitlines()[-1])
    pod1 = json.loads(outputs[1].strip().splitlines()[-1])
    # Global rank 0 lives in pod 0; it saw the whole world of 4 = 2 pods x 2 processes.
    assert pod0["metrics"] == {"rank": 0, "world": 4, "node": 0, "local": 0}
    # Rank 0 shared its outcome: pod 1's fit() returned the same Result, so code after fit()
    # (here: reading the checkpoint) runs identically on every pod.
    for key in ("metrics", "path", "checkpoint", "who", "history", "best"):
        assert pod1[key] == pod0[key], key
    assert pod0["path"] == str(storage)
    assert pod0["who"] == "0"
    # Side effects belong to pod 0: is_primary() says which pod that is.
    assert (pod0["primary"], pod1["primary"]) == (True, False)
    assert (storage / "checkpoint_000001" / "who").read_text() == "0"
