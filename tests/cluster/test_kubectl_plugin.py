"""The kubectl plugin as krew installs it (issue 41, item 5).

hack/kubectl-plugin.sh builds the archive (a launcher and one shiv zipapp of the CLI per CPython
3.10-3.13) and its krew manifest; the real krew (hack/build-testbin.sh krew) installs them
(`kubectl krew install --manifest --archive`, which checks the archive's sha256 against the
manifest) into a KREW_ROOT of its own. The commands then run with a PATH of krew's bin, kubectl
and the system's directories only: no venv, no PYTHONPATH, so what answers is the installed
zipapp (it unpacks into SHIV_ROOT, which the test checks), not the repository's code.

No operator runs: the test writes the job's status (a generation lost to a node) itself, as the
operator would, and reads it back through the plugin.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from tests import kube as k
from tests.cluster.operator_harness import torchjob

from torchjob.api.models import GROUP, PLURAL, VERSION

REPO = k.REPO_ROOT
PYTHON_VERSIONS = ("3.10", "3.11", "3.12", "3.13")


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true and {reason}", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Plugin:
    """The plugin as installed by krew, and the environment that runs it."""

    env: dict[str, str]
    shiv_root: Path
    kubeconfig: Path

    def run(
        self, *args: str, namespace: str, python: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(self.env, **({"TORCHJOB_PYTHON": python} if python else {}))
        argv = ["kubectl", "torchjob", *args, "--kubeconfig", str(self.kubeconfig)]
        proc = subprocess.run(
            [*argv, "-n", namespace], capture_output=True, text=True, timeout=120, env=env
        )
        assert proc.returncode == 0, f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr}"
        return proc


@pytest.fixture(scope="module")
def plugin(
    cluster: k.Cluster, crd: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Plugin]:
    krew = k.krew_dir() / "kubectl-krew"
    if not os.access(krew, os.X_OK):
        _unavailable(f"krew is not built ({krew}): run `make testbin` (hack/build-testbin.sh krew)")
    venv_bin = Path(sys.executable).parent
    if not os.access(venv_bin / "shiv", os.X_OK):
        _unavailable(f"shiv is not installed in {venv_bin}: run `make venv` (the dev extra)")
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        ["bash", str(REPO / "hack" / "kubectl-plugin.sh")],
        env={**os.environ, "DIST": str(dist), "PY": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, f"hack/kubectl-plugin.sh:\n{build.stderr}{build.stdout}"
    krew_root = tmp_path_factory.mktemp("krew")
    shiv_root = tmp_path_factory.mktemp("shiv")
    # Nothing of the venv or the repository: krew's bin, krew and kubectl, the system's.
    path = [krew_root / "bin", krew.parent, k.kubectl_path().parent]
    env = {
        "PATH": os.pathsep.join([*map(str, path), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": os.environ.get("HOME", str(krew_root)),
        "KREW_ROOT": str(krew_root),
        "KREW_NO_UPGRADE_CHECK": "1",
        "SHIV_ROOT": str(shiv_root),
        "COLUMNS": "200",
    }
    install = subprocess.run(
        [
            "kubectl",
            "krew",
            "install",
            f"--manifest={dist / 'krew' / 'torchjob.yaml'}",
            f"--archive={dist / 'kubectl-torchjob_linux_amd64.tar.gz'}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert install.returncode == 0, f"kubectl krew install:\n{install.stderr}{install.stdout}"
    found = shutil.which("kubectl-torchjob", path=env["PATH"])
    assert found == str(krew_root / "bin" / "kubectl-torchjob"), found
    try:
        yield Plugin(env=env, shiv_root=shiv_root, kubeconfig=cluster.kubeconfig)
    finally:  # the archive twice and up to four unpacked zipapps: 300 MB
        for tmp in (dist, krew_root, shiv_root):
            shutil.rmtree(tmp, ignore_errors=True)


def _cpython(version: str) -> str | None:
    """A CPython ``version`` interpreter on this machine (the system's, or pyenv's), or None."""
    candidates = [shutil.which(f"python{version}", path="/usr/local/bin:/usr/bin:/bin")]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    candidates += sorted(glob.glob(str(pyenv / "versions" / f"{version}.*" / "bin" / "python3")))
    for cand in filter(None, candidates):
        probe = subprocess.run(
            [cand, "-c", "import sys; print(sys.implementation.name, *sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.stdout.split() == ["cpython", *version.split(".")]:
            return cand
    return None


def _write_status(kube: Any, namespace: str, name: str) -> None:
    """What the operator would have published after losing a pod with its node."""
    history = [
        {"generation": 0, "began": "2026-11-28T06:14:02Z", "cause": "Start", "worldSize": 2},
        {
            "generation": 1,
            "began": "2026-11-28T06:15:31Z",
            "cause": "NodeLost",
            "worldSize": 2,
            "left": ["krewed-worker-1@node-a"],
            "joined": ["krewed-worker-1@node-b"],
            "restoredFrom": "memory",
            "recoverySeconds": 4.2,
            "stepsLost": 3,
        },
    ]
    status = {"phase": "Running", "currentGeneration": 1, "history": history}
    client.CustomObjectsApi(kube).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


def test_krew_installed_plugin_gets_describes_and_tells_the_history(
    plugin: Plugin, kube: Any, namespace: str, stop_process_operators: Callable[[], None]
) -> None:
    # The status below is written here: an operator left running by an earlier test would
    # reconcile the job and write its own (the ``jobs`` fixture starts one again later).
    stop_process_operators()
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, torchjob("krewed", replicas=2)
    )
    _write_status(kube, namespace, "krewed")

    rows = [line.split() for line in plugin.run("get", namespace=namespace).stdout.splitlines()]
    assert rows[0][:2] == ["NAME", "PHASE"], rows
    assert [r[:2] for r in rows[1:]] == [["krewed", "Running"]], rows

    page = plugin.run("describe", "krewed", namespace=namespace).stdout
    for part in ("krewed", "Running", "History:", "NodeLost", "krewed-worker-1@node-a"):
        assert part in page, page

    out = plugin.run("history", "krewed", namespace=namespace).stdout
    history = [line.split() for line in out.splitlines()]
    assert history[0][:3] == ["GEN", "BEGAN", "CAUSE"], history
    gen1 = next(r for r in history if r[0] == "1")
    assert gen1[3:] == [
        "NodeLost",
        "2",
        "krewed-worker-1@node-a",
        "krewed-worker-1@node-b",
        "memory",
        "4.2s",
        "3",
    ], history

    # The zipapp for the machine's python3 answered: shiv unpacked it into SHIV_ROOT.
    python3 = shutil.which("python3", path=plugin.env["PATH"])
    assert python3, "no python3 on the system PATH"
    ver = subprocess.run(
        [python3, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    unpacked = [p.name for p in plugin.shiv_root.iterdir()]
    assert any(n.startswith(f"kubectl-torchjob-py{ver}.pyz_") for n in unpacked), unpacked


@pytest.mark.parametrize("version", PYTHON_VERSIONS)
def test_krew_installed_plugin_runs_on_each_cpython_it_carries(
    plugin: Plugin, version: str
) -> None:
    """Each zipapp of the archive with its own CPython (TORCHJOB_PYTHON), where this machine
    has that version: a real request (no TorchJobs in kube-system)."""
    python = _cpython(version)
    if python is None:
        pytest.skip(f"no CPython {version} on this machine to run kubectl-torchjob-py{version}.pyz")
    proc = plugin.run("get", namespace="kube-system", python=python)
    assert proc.stderr.strip() == "No TorchJobs found in kube-system namespace.", proc.stderr
    unpacked = [p.name for p in plugin.shiv_root.iterdir()]
    assert any(n.startswith(f"kubectl-torchjob-py{version}.pyz_") for n in unpacked), unpacked
