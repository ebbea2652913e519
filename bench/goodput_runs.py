"""What code a goodput run measured, so that runs made apart can be read as one benchmark.

The full benchmark of issue 39 (5 modes x 2 systems x 3 repeats) takes 12-15 hours on a
2-core machine; it can run in parts (``--modes vanish --repeats 1 --repeat-from 2``, each part
with its own baselines, each row divided by its own part's). Each part writes ``run.json``
into its ``--out``: the command, the commit, and the git tree of every directory whose code
a row runs (operator, runtime, chart, images, bench's own code). bench/goodput_recompute.py
reads several parts back as one table and refuses parts that ran different code: a part
made after a docs-only commit is the same measurement; one after a runtime change is not.
"""

from __future__ import annotations

import fnmatch
import json
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
# What a row runs: the operator and its chart, the runtime and the images, the node tools;
# the workers, the jobs and the losses of the bench (not its reports: a part read back by a
# newer goodput_recompute.py is the same measurement).
CODE_DIRS = ("operator", "runtime", "charts", "images", "hack")
CODE_FILES = (
    "bench/_goodput_*.py",
    "bench/goodput_jobs.py",
    "bench/goodput_losses.py",
    "bench/goodput_rows.py",
    "bench/kubeflow.py",
    "tests/cluster/realnode.py",
)


def _git(repo: Path, *argv: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True
    ).stdout.strip()


def code_identity(repo: Path) -> dict[str, Any]:
    """The commit, the tree of each code directory at it, and whether the work tree changed
    any of them (a dirty run names no commit that reproduces it)."""
    trees: dict[str, str] = {path: _git(repo, "rev-parse", f"HEAD:{path}") for path in CODE_DIRS}
    for line in _git(repo, "ls-tree", "-r", "HEAD", "--", "bench", "tests/cluster").splitlines():
        meta, path = line.split("\t", 1)
        if any(fnmatch.fnmatch(path, pattern) for pattern in CODE_FILES):
            trees[path] = meta.split()[2]
    dirty = _git(repo, "status", "--porcelain", "--", *CODE_DIRS, *CODE_FILES)
    return {"commit": _git(repo, "rev-parse", "HEAD"), "trees": trees, "dirty": bool(dirty)}


def record_run(out: Path, repo: Path, argv: list[str]) -> dict[str, Any]:
    """Write ``out``/run.json: the command, when, and the code (``code_identity``)."""
    info = {
        "argv": argv,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        **code_identity(repo),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / RUN_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return info


def read_run(folder: Path) -> dict[str, Any] | None:
    """A part's run.json, or None for a run made before parts recorded their code."""
    path = folder / RUN_FILE
    return json.loads(path.read_text()) if path.exists() else None


def code_differences(runs: Mapping[str, Mapping[str, Any] | None]) -> list[str]:
    """Why parts (name -> run.json) cannot be read as one benchmark: a part without a
    record, a dirty work tree, or a code directory whose tree differs from the first
    part's. Empty when they ran the same code (their commits may differ)."""
    problems = []
    first: tuple[str, Mapping[str, Any]] | None = None
    for name, run in runs.items():
        if run is None:
            problems.append(f"{name}: no {RUN_FILE} (which code it ran is unknown)")
            continue
        if run.get("dirty"):
            problems.append(f"{name}: ran a work tree with uncommitted code changes")
        if first is None:
            first = (name, run)
            continue
        changed = _changed(first[1]["trees"], run["trees"])
        if changed:
            problems.append(
                f"{name} ({run['commit'][:9]}) ran other code than {first[0]} "
                f"({first[1]['commit'][:9]}): {', '.join(changed)}"
            )
    return problems


def _changed(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return [path for path in sorted(set(a) | set(b)) if a.get(path) != b.get(path)]


def describe(runs: Iterable[tuple[str, Mapping[str, Any] | None]]) -> str:
    """One line per part: its name, commit and start."""
    return "\n".join(
        f"  {name}: " + (f"{run['commit'][:9]}, started {run['started']}" if run else "no record")
        for name, run in runs
    )


if __name__ == "__main__":  # python bench/goodput_runs.py: this checkout's identity
    print(json.dumps(code_identity(Path(__file__).resolve().parents[1]), indent=1))
    sys.exit(0)
