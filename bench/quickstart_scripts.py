"""The two programs bench/quickstart_vs_torchrun.py runs: the Ray Train quickstart loop under
torchjob (``QUICKSTART``) and the same loop hand-written for ``torchrun`` (``PLAIN``), with
the marks (process start, imports, each epoch, the end) both write for the bench."""

from __future__ import annotations

import textwrap

COMMON = textwrap.dedent(
    """
    import time
    T0 = time.time()
    import json, os, sys, tempfile
    import torch
    from sklearn.datasets import load_digits

    EPOCHS = int(sys.argv[1])

    def marks(name, t=None):
        rank = int(os.environ.get("RANK", "0"))
        if rank == 0:
            with open(os.environ["QS_MARKS"], "a") as f:
                f.write(json.dumps({"mark": name, "t": time.time() if t is None else t}) + "\\n")

    def my_turn():
        \"\"\"--interleave: wait (every rank) until the turn file names this side.\"\"\"
        path = os.environ.get("QS_TURN")
        while path:
            with open(path) as f:
                if f.read() in (os.environ["QS_SIDE"], "done"):
                    return
            time.sleep(0.002)

    def pass_turn(last):
        \"\"\"--interleave: rank 0 hands the turn to the other side (after its last epoch, for
        good), then every rank meets it in a barrier, so none starts before the handover.\"\"\"
        path = os.environ.get("QS_TURN")
        if not path:
            return
        import torch.distributed as dist
        if int(os.environ.get("RANK", "0")) == 0:
            with open(path + ".tmp", "w") as f:
                f.write("done" if last else os.environ["QS_OTHER"])
            os.replace(path + ".tmp", path)
        dist.barrier()

    def make_model():
        return torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
            torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10))

    def dataset():
        x, y = load_digits(return_X_y=True)
        x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
        return torch.utils.data.TensorDataset(x, torch.tensor(y))
    """
)

QUICKSTART = COMMON + textwrap.dedent(
    """
    from torch.utils.data import DataLoader
    import torchjob.train
    from torchjob.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model

    def train_func(config):
        model = prepare_model(make_model())
        loader = prepare_data_loader(DataLoader(dataset(), batch_size=64, shuffle=True))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        first = True
        ckpt_s = 0.0
        for epoch in range(config["epochs"]):
            my_turn()
            t_epoch = time.time()
            marks("epoch_start", t_epoch)
            if epoch == EPOCHS - 2:
                marks("late")  # the threads' CPU is read here: at the end, some are gone
            if torchjob.train.get_context().get_world_size() > 1:
                loader.sampler.set_epoch(epoch)
            for x, y in loader:
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if first:
                    marks("first_step")
                    first = False
            t_ckpt = time.time()
            marks("epoch_steps", t_ckpt - t_epoch)
            with tempfile.TemporaryDirectory() as d:
                if torchjob.train.get_context().get_world_rank() == 0:
                    torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
                torchjob.train.report(
                    {"loss": loss.item(), "epoch": epoch}, checkpoint=Checkpoint.from_directory(d)
                )
            ckpt_s += time.time() - t_ckpt
            marks("epoch_ckpt", time.time() - t_ckpt)
            pass_turn(epoch == config["epochs"] - 1)
        marks("last_step")
        marks("ckpt_total", ckpt_s)

    class _StubWatch:
        \"\"\"The TorchJob watch a pod's MembershipWatch thread follows: one event, then idle.\"\"\"
        def __init__(self):
            import threading
            self.closed = threading.Event()
        def __iter__(self):
            status = {"currentGeneration": 0, "replicas": 1, "members": [0], "phase": "Running"}
            yield json.dumps({"type": "ADDED", "object": {
                "metadata": {"resourceVersion": "1"}, "status": status}}).encode()
            self.closed.wait()
        def close(self):
            self.closed.set()

    class _StubEndpoint:
        url = "stub://torchjob/qs"
        def call(self, method, body=None):
            return {"status": {"currentGeneration": 0, "replicas": 1}}
        def watch(self, resource_version, *, timeout_s):
            return _StubWatch()

    if __name__ == "__main__":
        with open(os.environ["QS_MARKS"], "a") as f:
            f.write(json.dumps({"mark": "start", "t": T0}) + "\\n")
        if os.environ.get("QS_POD"):  # the in-pod driver, its MembershipWatch on a stub
            from torchjob.train import controller
            controller.JobEndpoint.from_env = classmethod(lambda cls, pod, environ=None: _StubEndpoint())
        TorchTrainer(
            train_func,
            train_loop_config={"epochs": int(sys.argv[1])},
            scaling_config=ScalingConfig(num_workers=int(sys.argv[2])),
            run_config=RunConfig(
                name="qs", storage_path=sys.argv[3], progress=False,
                # --sync-commit: the checkpoint's commit inside report(), not after it
                checkpoint_config=CheckpointConfig(async_commit=not os.environ.get("QS_SYNC")),
            ),
        ).fit()
    """
)

PLAIN = COMMON + textwrap.dedent(
    """
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler

    def main():
        if int(os.environ["RANK"]) == 0:
            with open(os.environ["QS_MARKS"], "a") as f:
                f.write(json.dumps({"mark": "start", "t": T0}) + "\\n")
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        model = torch.nn.parallel.DistributedDataParallel(make_model())
        data = dataset()
        sampler = DistributedSampler(data, shuffle=True)
        loader = DataLoader(data, batch_size=64, sampler=sampler)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        first = True
        ckpt_s = 0.0
        out = sys.argv[2]
        for epoch in range(int(sys.argv[1])):
            my_turn()
            t_epoch = time.time()
            marks("epoch_start", t_epoch)
            if epoch == EPOCHS - 2:
                marks("late")  # the threads' CPU is read here: at the end, some are gone
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if first:
                    marks("first_step")
                    first = False
            t_ckpt = time.time()
            marks("epoch_steps", t_ckpt - t_epoch)
            if rank == 0:
                d = os.path.join(out, f"epoch_{epoch:03d}")
                os.makedirs(d, exist_ok=True)
                torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            dist.barrier()
            ckpt_s += time.time() - t_ckpt
            marks("epoch_ckpt", time.time() - t_ckpt)
            pass_turn(epoch == int(sys.argv[1]) - 1)
        marks("last_step")
        marks("ckpt_total", ckpt_s)
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)
