"""Fine-tune a small causal language model with FSDP2, sharded async checkpoints, on 4 CPU workers.

    python examples/finetune_fsdp/train.py                  # 4 local gloo workers
    python examples/finetune_fsdp/train.py --workers 2      # resumes the same run at 2 workers
    torchjob run -f examples/finetune_fsdp/job.yaml         # the same script as a TorchJob

The model is a plain PyTorch decoder-only transformer with random weights (nothing is
downloaded); the "corpus" is text from a fixed random Markov chain over a small vocabulary,
so the loss falls from ln(vocab) towards the chain's entropy. Each transformer block and the
root are sharded with ``fully_shard`` (FSDP2): every rank holds 1/N of the weights, gradients
and AdamW moments. The whole training state (model, optimizer, lr schedule, data position,
step, RNG) is a ``TrainState``; every ``--checkpoint-every`` steps each rank writes its own
shards in the background (``report(..., checkpoint=Checkpoint.from_state(state))``), and a
restart, at any number of workers, resumes from the latest committed checkpoint, resharded.
After training, one process loads the final checkpoint without a process group and samples.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed.checkpoint  # imported once here, so forked local workers share it
import torch.distributed.fsdp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchjob.train as train
from torchjob.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig, TrainState
from torchjob.train.torch import TorchTrainer, prepare_data_loader, prepare_model

MODEL = {"vocab": 256, "dim": 128, "heads": 4, "layers": 4, "seq": 64}


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class CausalLM(nn.Module):
    def __init__(self, vocab: int, dim: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def corpus(n: int, vocab: int, seq: int) -> TensorDataset:
    """``n`` sequences of ``seq + 1`` tokens from a fixed random Markov chain: each token has
    4 likely successors, so the best achievable loss is about ln(4) = 1.39 nats."""
    g = torch.Generator().manual_seed(1234)
    succ = torch.randint(0, vocab, (vocab, 4), generator=g)
    ids = torch.empty(n, seq + 1, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(seq):
        pick = torch.randint(0, 4, (n,), generator=g)
        ids[:, t + 1] = succ[ids[:, t], pick]
    return TensorDataset(ids)


def _torch_at_least(major: int, minor: int) -> bool:
    found = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    return found >= (major, minor)


def train_func(config: dict) -> None:
    ctx = train.get_context()
    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    shape = {**MODEL, **config.get("model", {})}
    model = CausalLM(**shape)
    if ctx.get_world_size() > 1:
        # torch < 2.7's FSDP2 on CPU cannot gather a block's weights again for its backward
        # (autograd sees the in-place all-gather): there the gathered weights stay until then.
        regather = torch.cuda.is_available() or _torch_at_least(2, 7)
        for block in model.blocks:  # one all-gather per block, freed after its forward
            torch.distributed.fsdp.fully_shard(block, reshard_after_forward=regather)
    model = prepare_model(model, parallel_strategy="fsdp")  # the root (FSDP2 at > 1 worker)
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"], weight_decay=0.01)
    warmup, total = 10, config["steps"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, total) / total))
        ),
    )
    data = corpus(config["samples"], shape["vocab"], shape["seq"])
    loader = prepare_data_loader(DataLoader(data, batch_size=config["batch"], shuffle=True))
    state = TrainState(model, opt, lr_scheduler=sched, data_loader=loader, extra={"epoch": 0})

    if (ckpt := train.get_checkpoint()) is not None:
        t = time.perf_counter()
        ckpt.load_state(state)  # each rank reads its shards, resharded to this world size
        if ctx.get_world_rank() == 0:
            print(
                f"resumed at step {state.step} from {ckpt.path} "
                f"on {ctx.get_world_size()} workers in {time.perf_counter() - t:.2f}s",
                flush=True,
            )

    started, tokens = time.perf_counter(), 0
    while state.step < total:
        loader.sampler.set_epoch(state.extra["epoch"])  # a resume continues mid-epoch
        for (ids,) in loader:
            if config.get("step_seconds"):
                time.sleep(config["step_seconds"])  # a demo's slower step (--step-seconds)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            state.step += 1
            tokens += ids[:, 1:].numel() * ctx.get_world_size()
            stop = train.should_stop()  # collective: a preemption on any worker
            if stop or state.step % config["checkpoint_every"] == 0 or state.step == total:
                t = time.perf_counter()
                metrics = {
                    "loss": round(loss.item(), 4),
                    "step": state.step,
                    "workers": ctx.get_world_size(),
                    "tokens_per_s": round(tokens / (time.perf_counter() - started)),
                }
                train.report(metrics, checkpoint=Checkpoint.from_state(state))
                if ctx.get_world_rank() == 0:
                    print(f"{metrics} checkpoint stall {time.perf_counter() - t:.3f}s", flush=True)
            if stop or state.step >= total:
                return
        state.extra["epoch"] += 1


def sample(checkpoint: Checkpoint, n: int = 24, shape: dict | None = None) -> list[int]:
    """One process, no process group: load the sharded checkpoint whole and sample greedily."""
    shape = {**MODEL, **(shape or {})}
    model = CausalLM(**shape)
    checkpoint.load_state(TrainState(model, rng=False))
    ids = torch.zeros(1, 1, dtype=torch.long)
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids[:, -shape["seq"] :])[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
    return ids[0].tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=int(os.environ.get("FINETUNE_STEPS", "120")))
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="sequences per worker per step")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--layers", type=int, default=MODEL["layers"], help="transformer blocks")
    p.add_argument("--dim", type=int, default=MODEL["dim"], help="model width")
    p.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="sleep this long in every step (a demo: time to preempt a pod by hand)",
    )
    p.add_argument("--name", default="finetune-fsdp")
    p.add_argument("--storage-path", default=None, help="fsspec URL or path (in a pod: the job's)")
    p.add_argument("--sync", action="store_true", help="report waits for each commit")
    args = p.parse_args()
    result = TorchTrainer(
        train_func,
        train_loop_config={
            "steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "batch": args.batch,
            "samples": args.samples,
            "lr": args.lr,
            "model": {"layers": args.layers, "dim": args.dim},
            "step_seconds": args.step_seconds,
        },
        scaling_config=ScalingConfig(num_workers=args.workers),
        run_config=RunConfig(
            name=args.name,
            storage_path=args.storage_path,
            progress=False,
            checkpoint_config=CheckpointConfig(num_to_keep=2, async_commit=not args.sync),
        ),
    ).fit()
    print(f"[finetune] final {result.metrics} checkpoint {result.checkpoint.path}")
    if train.is_primary():
        print(
            f"[finetune] greedy sample from the checkpoint: {sample(result.checkpoint, shape={'layers': args.layers, 'dim': args.dim})}"
        )


if __name__ == "__main__":
    main()
