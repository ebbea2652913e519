"""The runtime's settings (``torchjob.launch.settings``): defaults, parsing, an error that
names the variable, the table in docs/runtime.md; and the store's key layout
(``torchjob.launch.layout``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchjob.launch.layout import StoreLayout
from torchjob.launch.settings import RuntimeSettings, SettingError, WorkerEnv, settings_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runtime.md"


def test_defaults_when_nothing_is_set() -> None:
    assert RuntimeSettings.from_env({}) == RuntimeSettings(
        silent_peer_s=3.0,
        worker_start="auto",
        start_timeout_s=120.0,
        nccl_reform=False,
        shard_mirror=True,
        use_libuv=True,
        nccl_async_error_handling=None,
    )


@pytest.mark.parametrize(
    ("env", "field", "value"),
    [
        pytest.param({"TORCHJOB_SILENT_PEER_S": "2.5"}, "silent_peer_s", 2.5, id="silent"),
        pytest.param({"TORCHJOB_SILENT_PEER_S": "0"}, "silent_peer_s", 0.0, id="silent-off"),
        pytest.param({"TORCHJOB_SILENT_PEER_S": ""}, "silent_peer_s", 3.0, id="silent-empty"),
        pytest.param({"TORCHJOB_WORKER_START": "spawn"}, "worker_start", "spawn", id="spawn"),
        pytest.param({"TORCHJOB_WORKER_START": ""}, "worker_start", "auto", id="start-empty"),
        pytest.param(
            {"TORCHJOB_WORKER_START_TIMEOUT_S": "600"}, "start_timeout_s", 600.0, id="start-in"
        ),
        pytest.param({"TORCHJOB_NCCL_REFORM": "1"}, "nccl_reform", True, id="nccl-reform"),
        pytest.param({"TORCHJOB_NCCL_REFORM": "yes"}, "nccl_reform", False, id="nccl-only-1"),
        pytest.param({"TORCHJOB_SHARD_MIRROR": " Off "}, "shard_mirror", False, id="mirror-off"),
        pytest.param({"TORCHJOB_SHARD_MIRROR": ""}, "shard_mirror", True, id="mirror-empty"),
        pytest.param({"USE_LIBUV": "0"}, "use_libuv", False, id="libuv-off"),
        pytest.param({"USE_LIBUV": "False"}, "use_libuv", False, id="libuv-False"),
        pytest.param(
            {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"},
            "nccl_async_error_handling",
            "3",
            id="nccl-aeh",
        ),
    ],
)
def test_each_setting_is_parsed(env: dict[str, str], field: str, value: object) -> None:
    assert getattr(RuntimeSettings.from_env(env), field) == value


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"TORCHJOB_SILENT_PEER_S": "fast"},
            "TORCHJOB_SILENT_PEER_S='fast' is not a number of seconds",
            id="silent-text",
        ),
        pytest.param(
            {"TORCHJOB_SILENT_PEER_S": "-1"},
            "TORCHJOB_SILENT_PEER_S='-1' must be a number of seconds >= 0",
            id="silent-negative",
        ),
        pytest.param(
            {"TORCHJOB_WORKER_START_TIMEOUT_S": "0"},
            "TORCHJOB_WORKER_START_TIMEOUT_S='0' must be a number of seconds > 0",
            id="start-timeout-zero",
        ),
        pytest.param(
            {"TORCHJOB_WORKER_START": "forkserver"},
            "TORCHJOB_WORKER_START='forkserver' must be one of auto, zygote, fork, spawn",
            id="start",
        ),
    ],
)
def test_a_bad_value_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingError) as info:
        RuntimeSettings.from_env(env)
    assert str(info.value) == message


def test_the_docs_table_is_the_settings() -> None:
    assert settings_table(RuntimeSettings) in DOCS.read_text()
    assert settings_table(WorkerEnv) in DOCS.read_text()


def test_a_workers_environment_and_its_store() -> None:
    env = WorkerEnv.from_env(
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "TORCHELASTIC_RESTART_COUNT": "7",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29500",
            "TORCHJOB_LAUNCH_STORE_SERVED": "2",
        }
    )
    assert (env.rank, env.local_rank, env.world_size, env.generation) == (3, 1, 4, 7)
    layout = env.layout(RuntimeSettings.from_env({"USE_LIBUV": "0"}))
    assert layout == StoreLayout("10.0.0.1", 29500, 7, formation=2, use_libuv=False)
    with pytest.raises(SettingError, match="MASTER_PORT='http' is not an integer"):
        WorkerEnv.from_env({"MASTER_PORT": "http"})
    with pytest.raises(SettingError, match="MASTER_PORT='70000' is not a port"):
        WorkerEnv.from_env({"MASTER_PORT": "70000"})


@pytest.mark.parametrize(
    ("layout", "rendezvous"),
    [
        pytest.param(StoreLayout("h", 1, 4), "torchjob/g4", id="rank-0-serves"),
        pytest.param(StoreLayout("h", 1, 4, formation=3), "torchjob/g4/f3", id="driver-serves"),
    ],
)
def test_the_store_key_layout(layout: StoreLayout, rendezvous: str) -> None:
    assert layout.rendezvous == rendezvous
    assert layout.heartbeat == "torchjob/g4/hb"
    assert layout.group == "torchjob/g4/group"
    assert (StoreLayout.ABORT_KEY, StoreLayout.PROBE_KEY) == ("abort", "torchjob/probe")
    assert StoreLayout.beat_key(12) == "12"


def test_no_other_module_spells_the_store_keys() -> None:
    runtime = Path(__file__).resolve().parents[2] / "runtime"
    spelled = [
        str(p.relative_to(runtime))
        for p in runtime.rglob("*.py")
        if "torchjob/g" in p.read_text() or '"torchjob/probe"' in p.read_text()
    ]
    assert spelled == ["torchjob/launch/layout.py"]
