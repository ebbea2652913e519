"""hack/node.sh's input checks and names, which need no cluster: a bad count, index, node or
provider is refused with an error naming it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

NODE_SH = Path(__file__).resolve().parents[2] / "hack" / "node.sh"


def node_sh(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    full.update(TORCHJOB_CLUSTER_NAME="unit-node-sh", **env)
    return subprocess.run(
        ["bash", str(NODE_SH), *args], capture_output=True, text=True, env=full, timeout=30
    )


def test_names_follow_the_count_and_node_0_keeps_its_name() -> None:
    assert node_sh("names").stdout.split() == ["unit-node-sh-real-0"]
    three = node_sh("names", TORCHJOB_REAL_NODES="3").stdout.split()
    assert three == [f"unit-node-sh-real-{k}" for k in range(3)]
    assert node_sh("name", TORCHJOB_REAL_NODES="3").stdout.strip() == "unit-node-sh-real-0"
    assert node_sh("host-ip", TORCHJOB_NODE_NET_INDEX="46").stdout.strip() == "10.213.46.1"


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (
            ["names"],
            {"TORCHJOB_REAL_NODES": "9"},
            "TORCHJOB_REAL_NODES=9: a number of real nodes from 1 to 8",
        ),
        (["names"], {"TORCHJOB_REAL_NODES": "two"}, "TORCHJOB_REAL_NODES=two"),
        (
            ["host-ip"],
            {"TORCHJOB_NODE_NET_INDEX": "300"},
            "TORCHJOB_NODE_NET_INDEX=300: a number from 0 to 255",
        ),
        (["vanish", "other-real-1"], {}, "no real node 'other-real-1' in cluster 'unit-node-sh'"),
        (["return", "8"], {}, "no real node '8'"),
        (
            ["notice", "1", "--provider", "azure"],
            {},
            "notice --provider azure: one of aws, karpenter",
        ),
        (
            ["notice", "1", "--drain-after", "9", "--vanish-after", "5"],
            {},
            "--vanish-after (5) must be later than --drain-after (9)",
        ),
        (["notice", "1", "--drain-after", "soon"], {}, "notice --drain-after soon: whole seconds"),
        (
            ["notice", "1", "--condition", "bad type"],
            {},
            "notice --condition bad type: a condition type",
        ),
    ],
)
def test_bad_input_is_refused_naming_it(args: list[str], env: dict[str, str], said: str) -> None:
    proc = node_sh(*args, **env)
    assert proc.returncode != 0
    assert said in proc.stderr, proc.stderr


def test_seed_refuses_an_archive_that_is_not_there(tmp_path: Path) -> None:
    missing = tmp_path / "operator-0123456789abcdef.tar"
    done = node_sh("seed", str(missing), TORCHJOB_NODE_ROOTS=str(tmp_path / "roots"))
    assert done.returncode != 0
    assert f"no image archive {missing}" in done.stderr
    assert not (tmp_path / "roots").exists()  # nothing prepared


def test_make_node_images_seeds_the_images_the_real_node_sessions_start_with() -> None:
    """CI prepares the seeded root of `make node-images`; a session whose images differ would
    prepare its own beside the other sessions (the cost CI moved out of make test)."""
    from tests.cluster.realnode import IMAGES

    makefile = (NODE_SH.parents[1] / "Makefile").read_text()
    (line,) = [x for x in makefile.splitlines() if x.startswith("NODE_IMAGES = ")]
    assert tuple(line.removeprefix("NODE_IMAGES = ").split()) == IMAGES
