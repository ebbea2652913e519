"""What a laptop user waits for: the Ray Train quickstart loop under torchjob vs the same loop
hand-written for torchrun (issue 16, item "nothing imported that a step does not need").

Both sides train a small CNN on scikit-learn's digits (1797 8x8 images, no download) with 2
gloo workers for ``--epochs`` epochs, a checkpoint per epoch written by rank 0:

- ``torchjob``: ``python quickstart.py``, the Ray Train quickstart with ``ray.train`` replaced
  by ``torchjob.train`` (``TorchTrainer(...).fit()``, ``prepare_model``,
  ``prepare_data_loader``, ``report(metrics, checkpoint=Checkpoint.from_directory(d))``);
- ``torchrun``: ``torchrun --standalone --nproc-per-node 2 plain.py``: ``init_process_group``,
  DDP, a ``DistributedSampler``, ``torch.save`` of the state per epoch by rank 0.

torchjob runs once per worker start path (``--starts``: ``zygote``, the default; ``fork``, each
worker forked from the driver where safe; ``spawn``, fresh interpreters; the
``TORCHJOB_WORKER_START`` values) and per place (``--paths``): ``local`` is a laptop's
``fit()``; ``pod`` is the in-pod driver of a one-pod TorchJob (the operator's env contract,
``membershipPolicy: KeepSurvivors``), run here without a cluster: its ``MembershipWatch``
thread follows a stub of the TorchJob's watch (one ``ADDED`` event, then an idle connection),
so the driver runs that thread while its workers start, as in a pod.

Each repeat runs torchrun and every torchjob variant once, in an order that rotates every
repeat; each run prints the wall clock at its first line, its first step and its last step, so
the difference splits into start-up (process start -> first step), training (first -> last
step) and the end (last step -> exit); ``steps`` is the training phase less rank 0's time in
the per-epoch checkpoint (torchjob: save and ``report``; torchrun: save and barrier). Wall time is measured around the child process; CPU is
the children's user + system time (``RUSAGE_CHILDREN``, which includes every worker process
and the zygote). ``train-cpu-ranks`` and ``train-cpu-others`` split the CPU the run's
processes spent in the training phase (read from /proc at the first and the last step, polled
every 20 ms): the busiest ``--workers`` processes (the ranks), and all the others (torchjob's
driver and zygote, torchrun's agent), which compete with the ranks for the same cores;
``train-cpu-rank-threads`` is the ranks' threads other than their main thread (gloo's, and
torchjob's heartbeat and event threads; from the first step to the start of the last epoch but
one, as some end with the group), named in the log.
``epoch-p50`` is rank 0's median epoch (its steps, epochs 2..N). The ratios are same-repeat
ratios against that repeat's torchrun run (the machine may be loaded by others: a pair shares
its load), printed as median and [min-max]. Asserts nothing.

``--interleave`` measures the training phase alone, for a machine whose speed drifts in spells
of tens of seconds (the 2-core sandbox: the same run's epochs take 0.19 s in one run and 0.30 s
in the next, so whole runs a minute apart cannot be compared to 2 %): each variant and torchrun
run at the same time and take turns epoch by epoch (a turn file: every rank waits for its
side's turn, polling every 2 ms; rank 0 hands the turn over after its epoch's checkpoint, and
a barrier holds its side until then). Epoch i of each side is then next to epoch i of the other
in time; per repeat the bench prints the median over epochs of the ratio of the two sides'
epoch i (its steps; and its steps with its checkpoint), and checks from the marks that the
turns did alternate. Both sides pay the same turn-taking; the side that waits holds its
processes idle (its background threads, torchjob's heartbeat and torchrun's agent, still run:
about 0.1 % of a core each, ``train-cpu-others``). Rank 0's background checkpoint commit
(``async_commit``, the default) runs on after ``report()`` returns and may land in the other
side's turn; ``--sync-commit`` keeps it inside ``report()`` (``async_commit=False``), which
charges torchjob all of it.

    python bench/quickstart_vs_torchrun.py [--repeats 3] [--epochs 10] [--workers 2]
        [--starts zygote,fork,spawn] [--paths local,pod] [--interleave] [--sync-commit]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import spread as _spread
from bench.quickstart_scripts import PLAIN, QUICKSTART
from torchjob.launch import malloc


def command(
    kind: str, args: argparse.Namespace, work: Path
) -> tuple[list[str], dict[str, str], Path]:
    """The command line, environment and output folder of one run of ``kind``."""
    out = Path(tempfile.mkdtemp(dir=work, prefix=f"{kind.replace(':', '-')}-"))
    env = {**os.environ, "QS_MARKS": str(out / "marks.jsonl"), "OMP_NUM_THREADS": "1"}
    if kind.startswith("torchjob"):
        _, start, where = kind.split(":")
        env["TORCHJOB_WORKER_START"] = start
        if args.sync_commit:
            env["QS_SYNC"] = "1"
        cmd = [sys.executable, str(work / "quickstart.py"), str(args.epochs), str(args.workers),
               str(out / "storage")]  # fmt: skip
        if where == "pod":
            env.update(pod_env(args.workers, out / "storage"))
    else:
        env.update(malloc.glibc_env())  # the thresholds torchjob's workers set themselves
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.workers}", str(work / "plain.py"), str(args.epochs),
               str(out / "ckpt")]  # fmt: skip
    return cmd, env, out


def run_interleaved(kind: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """``kind`` and torchrun at once, taking turns epoch by epoch (``--interleave``), so that
    both meet the same spells of a noisy machine. Returns the median over epochs of the ratio
    of ``kind``'s epoch i to torchrun's epoch i (adjacent in time): its steps, and its steps
    with its checkpoint."""
    turn = work / f"turn-{time.monotonic_ns()}"
    turn.write_text("torchrun")  # torchrun's first epoch first
    procs, outs = {}, {}
    for side, other in ((kind, "torchrun"), ("torchrun", kind)):
        cmd, env, outs[side] = command(side, args, work)
        env.update(QS_TURN=str(turn), QS_SIDE=side, QS_OTHER=other)
        procs[side] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, cwd=work)
    for proc in procs.values():
        if proc.wait() != 0:
            raise subprocess.CalledProcessError(proc.returncode, proc.args)
    (ours, ours_full), (theirs, theirs_full) = (epoch_series(outs[k] / "marks.jsonl")
                                                for k in (kind, "torchrun"))  # fmt: skip
    # The turns did alternate: merged by start time, every epoch start follows the other side's.
    starts = sorted(
        (rec["t"], side)
        for side in (kind, "torchrun")
        for rec in map(json.loads, (outs[side] / "marks.jsonl").read_text().splitlines())
        if rec["mark"] == "epoch_start"
    )
    if any(a[1] == b[1] for a, b in itertools.pairwise(starts)):
        raise RuntimeError(f"{kind} and torchrun did not take turns: {starts}")
    return {
        "epoch": statistics.median(a / b for a, b in zip(ours, theirs, strict=True)),
        "epoch+ckpt": statistics.median(a / b for a, b in zip(ours_full, theirs_full, strict=True)),
        "epochs": len(ours),
    }


def run_once(kind: str, args: argparse.Namespace, work: Path) -> dict[str, float]:
    """One run (``torchrun``, or ``torchjob:START:PATH``): wall, CPU (children), the marks."""
    cmd, env, out = command(kind, args, work)
    marks = out / "marks.jsonl"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, cwd=work)
    # CPU of every process of the run at its first and its last step (polled: within 20 ms).
    at: dict[str, Snapshot] = {}
    while proc.poll() is None:
        text = marks.read_text() if marks.exists() else ""
        for mark in ("first_step", "late", "last_step"):
            if mark not in at and f'"{mark}"' in text:
                at[mark] = tree_cpu(proc.pid)
        time.sleep(0.02)
    t1 = time.time()
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m: dict[str, float] = {}
    for line in marks.read_text().splitlines():
        rec = json.loads(line)
        m.setdefault(rec["mark"], rec["t"])
    empty = Snapshot({}, {})
    first, late, last = (at.get(m, empty) for m in ("first_step", "late", "last_step"))
    by_pid = {pid: last.cpu[pid] - cpu for pid, cpu in first.cpu.items() if pid in last.cpu}
    ranks = sorted(by_pid, key=by_pid.__getitem__, reverse=True)[: args.workers]
    spent = sorted(by_pid.values(), reverse=True)
    # The ranks' threads other than their main thread (the training loop), by thread name,
    # from the first step to the start of the last epoch but one.
    # Threads that ended meanwhile (a background checkpoint commit's) are the process's CPU
    # less its live threads'.
    helpers: dict[str, float] = {}
    for pid in ranks:
        before_t = first.threads.get(pid, {})
        live = 0.0
        for (tid, name), cpu in late.threads.get(pid, {}).items():
            spent_t = cpu - before_t.get((tid, name), 0.0)
            live += spent_t
            if tid != pid:
                helpers[name] = helpers.get(name, 0.0) + spent_t
        ended = late.cpu.get(pid, 0.0) - first.cpu.get(pid, 0.0) - live
        helpers["(ended threads)"] = helpers.get("(ended threads)", 0.0) + max(ended, 0.0)
    if helpers:
        top = sorted(helpers.items(), key=lambda kv: -kv[1])[:6]
        print(f"    {kind}: ranks' other threads in the training phase: "
              + ", ".join(f"{n} {c:.2f}s" for n, c in top), file=sys.stderr)  # fmt: skip
    return {
        "wall": t1 - t0,
        "cpu": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "start-up": m["first_step"] - t0,
        "training": m["last_step"] - m["first_step"],
        "end": t1 - m["last_step"],
        # Training without the per-epoch checkpoint (save and report / save and barrier).
        "steps": m["last_step"] - m["first_step"] - m["ckpt_total"],
        # CPU in the training phase: the busiest `workers` processes (the ranks), the rest.
        "train-cpu-ranks": sum(spent[: args.workers]),
        "train-cpu-others": sum(spent[args.workers :]),
        "train-cpu-rank-threads": sum(helpers.values()),
        **epoch_figures(marks),
    }


def epoch_series(marks: Path) -> tuple[list[float], list[float]]:
    """Rank 0's epochs after the first (whose first step warms up): each one's steps, and each
    one's steps plus its checkpoint (save and ``report`` / save and barrier)."""
    series: dict[str, list[float]] = {"epoch_steps": [], "epoch_ckpt": []}
    for line in marks.read_text().splitlines():
        rec = json.loads(line)
        series.get(rec["mark"], []).append(rec["t"])
    steps, ckpts = series["epoch_steps"][1:], series["epoch_ckpt"][1:]
    return steps, [a + b for a, b in zip(steps, ckpts, strict=False)]


def epoch_figures(marks: Path) -> dict[str, float]:
    """The median epoch (``epoch-p50``: its steps; ``epoch+ckpt-p50``: with its checkpoint):
    robust to a slow spell of the machine within a run."""
    steps, full = epoch_series(marks)
    if not steps:
        return {"epoch-p50": float("nan"), "epoch+ckpt-p50": float("nan")}
    return {"epoch-p50": statistics.median(steps), "epoch+ckpt-p50": statistics.median(full)}


def _stat_cpu(stat: str) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) from a /proc ``stat`` line."""
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    """CPU seconds of a process tree at one moment: by pid, and each process's threads."""

    cpu: dict[int, float]
    threads: dict[int, dict[tuple[int, str], float]]
    """pid -> (tid, thread name) -> CPU seconds."""


def tree_cpu(root: int) -> Snapshot:
    """User + system CPU seconds of ``root`` and each of its descendants, and of their
    threads (/proc)."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            parent[int(d.name)], cpu[int(d.name)] = _stat_cpu((d / "stat").read_text())
        except OSError:  # gone meanwhile
            continue
    tree = {root}
    grew = True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}
        tree |= more
        grew = bool(more)
    snap = Snapshot({pid: cpu[pid] for pid in tree if pid in cpu}, {})
    for pid in snap.cpu:
        threads = snap.threads.setdefault(pid, {})
        for t in Path(f"/proc/{pid}/task").glob("*"):
            try:
                stat = (t / "stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            threads[(int(t.name), name)] = _stat_cpu(stat)[1]
    return snap


def pod_env(nproc: int, storage: Path) -> dict[str, str]:
    """The operator's env contract for pod 0 of a one-pod KeepSurvivors TorchJob."""
    from torchjob.contract import PodEnv, free_port

    pod = PodEnv(
        job_name="qs", namespace="bench", pod_index=0, replicas=1, nproc_per_node=nproc,
        generation=0, rdzv_host="127.0.0.1", rdzv_port=free_port(), backend="gloo",
        checkpoint_path=str(storage), membership="KeepSurvivors",
    )  # fmt: skip
    return {**pod.to_env(), "QS_POD": "1", "TORCHJOB_TERMINATION_LOG": str(storage / "term")}


RATIOS = ("wall", "cpu", "training", "steps", "epoch-p50", "train-cpu-ranks")


def spread(values: list[float]) -> str:
    return _spread(values, suffix="x")


def interleaved(variants: list[str], args: argparse.Namespace, work: Path) -> int:
    """``--interleave``: per repeat, each variant against torchrun, epoch by epoch."""
    ratios: dict[str, list[dict[str, float]]] = {k: [] for k in variants}
    for i in range(args.repeats):
        for kind in variants:
            r = run_interleaved(kind, args, work)
            ratios[kind].append(r)
            print(f"[{i + 1}/{args.repeats}] {kind:24} epoch {r['epoch']:.3f}x  epoch+ckpt "
                  f"{r['epoch+ckpt']:.3f}x  ({r['epochs']:.0f} epoch pairs)",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"digits, small CNN, {args.workers} gloo workers, {args.epochs} epochs; each variant and "
        "torchrun run at once, taking turns epoch by epoch; per repeat the median over epochs of "
        f"(variant's epoch i / torchrun's epoch i); {args.repeats} repeats as median [min-max]"
    )
    print(f"{'training phase vs torchrun':28}{'steps':>20}{'steps + checkpoint':>22}")
    for kind in variants:
        cells = [spread([r[k] for r in ratios[kind]]) for k in ("epoch", "epoch+ckpt")]
        print(f"{kind:28}{cells[0]:>20}{cells[1]:>22}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--starts", default="zygote,fork,spawn")
    p.add_argument("--paths", default="local,pod")
    p.add_argument("--sync-commit", action="store_true",
                   help="torchjob commits each checkpoint inside report() (async_commit=False), "
                   "so no commit runs on after its turn")  # fmt: skip
    p.add_argument("--interleave", action="store_true",
                   help="the training phase alone: each variant and torchrun at once, taking "
                   "turns epoch by epoch")  # fmt: skip
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tj-quickstart-"))
    (work / "quickstart.py").write_text(QUICKSTART)
    (work / "plain.py").write_text(PLAIN)
    variants = [f"torchjob:{s}:{w}" for w in args.paths.split(",") for s in args.starts.split(",")]
    if args.interleave:
        return interleaved(variants, args, work)
    kinds = ["torchrun", *variants]
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for i in range(args.repeats):
        order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
        for kind in order:
            r = run_once(kind, args, work)
            runs[kind].append(r)
            print(f"[{i + 1}/{args.repeats}] {kind:24} " + "  ".join(
                f"{k} {v:.3f}s" for k, v in r.items()), file=sys.stderr, flush=True)  # fmt: skip
    keys = ("wall", "cpu", "start-up", "training", "end", "steps", "epoch-p50",
            "train-cpu-ranks", "train-cpu-others", "train-cpu-rank-threads")  # fmt: skip
    print(
        f"digits, small CNN, {args.workers} gloo workers, {args.epochs} epochs, a checkpoint per "
        f"epoch; {args.repeats} repeats (rotating order): medians, and same-repeat ratios against "
        "torchrun as median [min-max]"
    )
    width = {k: max(11, len(k) + 2) for k in keys}
    print(f"{'':24}" + "".join(f"{k:>{width[k]}}" for k in keys))
    for kind in kinds:
        med = {k: statistics.median(r[k] for r in runs[kind]) for k in keys}
        print(f"{kind:24}" + "".join(f"{med[k]:>{width[k] - 1}.3f}s" for k in keys))
    print(f"\n{'ratio vs torchrun':24}" + "".join(f"{k:>20}" for k in RATIOS))
    for kind in variants:
        pairs = list(zip(runs[kind], runs["torchrun"], strict=True))
        cells = [spread([a[k] / b[k] if b[k] else float("nan") for a, b in pairs]) for k in RATIOS]
        print(f"{kind:24}" + "".join(f"{c:>20}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
