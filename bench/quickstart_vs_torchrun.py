"""What a laptop user waits for: the Ray Train quickstart loop under torchjob vs the same loop
hand-written for torchrun (issue 16, item "nothing imported that a step does not need").

Both sides train a small CNN on scikit-learn's digits (1797 8x8 images, no download) with 2
gloo workers for ``--epochs`` epochs, a checkpoint per epoch written by rank 0:

- ``torchjob``: ``python quickstart.py``, the Ray Train quickstart with ``ray.train`` replaced
  by ``torchjob.train`` (``TorchTrainer(...).fit()``, ``prepare_model``,
  ``prepare_data_loader``, ``report(metrics, checkpoint=Checkpoint.from_directory(d))``);
- ``torchrun``: ``torchrun --standalone --nproc-per-node 2 plain.py``: ``init_process_group``,
  DDP, a ``DistributedSampler``, ``torch.save`` of the state per epoch by rank 0.

The runs alternate (which goes first flips every repeat); each prints the wall clock at its
first line, its first step and its last step, so the difference splits into start-up (process
start -> first step), training (first -> last step) and the end (last step -> exit). Wall time
is measured around the child process; CPU is the children's user + system time
(``RUSAGE_CHILDREN``, which includes every worker process). Prints medians and ratios;
asserts nothing.

    python bench/quickstart_vs_torchrun.py [--repeats 5] [--epochs 10] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

COMMON = textwrap.dedent(
    """
    import time
    T0 = time.time()
    import json, os, sys, tempfile
    import torch
    from sklearn.datasets import load_digits

    def marks(name):
        rank = int(os.environ.get("RANK", "0"))
        if rank == 0:
            with open(os.environ["QS_MARKS"], "a") as f:
                f.write(json.dumps({"mark": name, "t": time.time()}) + "\\n")

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
    from torchjob.train import Checkpoint, RunConfig, ScalingConfig
    from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model

    def train_func(config):
        model = prepare_model(make_model())
        loader = prepare_data_loader(DataLoader(dataset(), batch_size=64, shuffle=True))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        loss_fn = torch.nn.CrossEntropyLoss()
        first = True
        for epoch in range(config["epochs"]):
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
            with tempfile.TemporaryDirectory() as d:
                if torchjob.train.get_context().get_world_rank() == 0:
                    torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
                torchjob.train.report(
                    {"loss": loss.item(), "epoch": epoch}, checkpoint=Checkpoint.from_directory(d)
                )
        marks("last_step")

    if __name__ == "__main__":
        with open(os.environ["QS_MARKS"], "a") as f:
            f.write(json.dumps({"mark": "start", "t": T0}) + "\\n")
        TorchTrainer(
            train_func,
            train_loop_config={"epochs": int(sys.argv[1])},
            scaling_config=ScalingConfig(num_workers=int(sys.argv[2])),
            run_config=RunConfig(name="qs", storage_path=sys.argv[3], progress=False),
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
        out = sys.argv[2]
        for epoch in range(int(sys.argv[1])):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = loss_fn(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if first:
                    marks("first_step")
                    first = False
            if rank == 0:
                d = os.path.join(out, f"epoch_{epoch:03d}")
                os.makedirs(d, exist_ok=True)
                torch.save(model.module.state_dict(), os.path.join(d, "model.pt"))
            dist.barrier()
        marks("last_step")
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


def run_once(kind: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """One run: wall, CPU (children), and the marks (start, first_step, last_step)."""
    out = Path(tempfile.mkdtemp(dir=work, prefix=f"{kind}-"))
    marks = out / "marks.jsonl"
    env = {**os.environ, "QS_MARKS": str(marks), "OMP_NUM_THREADS": "1"}
    if kind == "torchjob":
        cmd = [sys.executable, str(work / "quickstart.py"), str(args.epochs), str(args.workers),
               str(out / "storage")]  # fmt: skip
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.workers}", str(work / "plain.py"), str(args.epochs),
               str(out / "ckpt")]  # fmt: skip
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, cwd=work)
    t1 = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = {}
    for line in marks.read_text().splitlines():
        rec = json.loads(line)
        m.setdefault(rec["mark"], rec["t"])
    return {
        "wall": t1 - t0,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "start-up": m["first_step"] - t0,
        "training": m["last_step"] - m["first_step"],
        "end": t1 - m["last_step"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tj-quickstart-"))
    (work / "quickstart.py").write_text(QUICKSTART)
    (work / "plain.py").write_text(PLAIN)
    runs: dict[str, list[dict[str, float]]] = {"torchjob": [], "torchrun": []}
    for i in range(args.repeats):
        order = ("torchjob", "torchrun") if i % 2 == 0 else ("torchrun", "torchjob")
        for kind in order:
            r = run_once(kind, args, work)
            runs[kind].append(r)
            print(f"[{i + 1}/{args.repeats}] {kind:8} " + "  ".join(
                f"{k} {v:.2f}s" for k, v in r.items()), file=sys.stderr, flush=True)  # fmt: skip
    keys = ("wall", "cpu", "start-up", "training", "end")
    print(
        f"digits, small CNN, {args.workers} gloo workers, {args.epochs} epochs, a checkpoint per "
        f"epoch; median of {args.repeats} (alternating order)"
    )
    print(f"{'':10}" + "".join(f"{k:>11}" for k in keys))
    med = {
        kind: {k: statistics.median(r[k] for r in rs) for k in keys} for kind, rs in runs.items()
    }
    for kind in runs:
        print(f"{kind:10}" + "".join(f"{med[kind][k]:>10.2f}s" for k in keys))
    ratio = {k: med["torchjob"][k] / med["torchrun"][k] for k in keys if med["torchrun"][k]}
    print(f"{'ratio':10}" + "".join(f"{ratio.get(k, float('nan')):>10.2f}x" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
