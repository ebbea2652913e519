"""Which files of a sharded (DCP) checkpoint a rank wrote (``torchjob.train._sharded``): from
the metadata ``save`` returned, or, where that holds no ``storage_data`` (torch 2.11's async
save of a GPU state returned such a one), from the checkpoint's own ``.metadata``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save

from torchjob.train._sharded import DCP_METADATA, _own_files


def test_a_rank_s_files_come_from_the_checkpoint_when_the_metadata_lacks_them(
    tmp_path: Path,
) -> None:
    state = {"w": torch.arange(6.0).reshape(2, 3), "step": torch.tensor(7)}
    metadata = save(state, storage_writer=FileSystemWriter(str(tmp_path)), no_dist=True)
    written = sorted(p.name for p in tmp_path.iterdir())
    assert DCP_METADATA in written and any(n.startswith("__0_") for n in written)
    from_save = _own_files(metadata, 0, str(tmp_path))
    assert sorted(from_save) == written
    bare = dataclasses.replace(metadata, storage_data=None)
    assert _own_files(bare, 0, str(tmp_path)) == from_save
    assert _own_files(bare, 1, str(tmp_path)) == [], "rank 1 wrote nothing here"


def test_the_generation_s_stager_is_kept_where_torch_s_stager_stages_again() -> None:
    """The saver keeps one stager (one host copy, refreshed in place) where this torch's
    ``DefaultStager`` stages more than once, and takes a new one per save where it does not
    (torch 2.11's closes its copier after every stage: its second save of a generation failed
    with ``KeyError: <class 'type'>``)."""
    from torch.distributed.checkpoint.staging import DefaultStager

    from torchjob.train._sharded import ShardedSaver, new_stager, stager_reusable

    state = {"w": torch.arange(6.0), "step": 3, "groups": [{"lr": 0.1, "betas": (0.9, 0.99)}]}
    saver = ShardedSaver("file:///unused", rank=0, world_size=1)
    first = saver._staging().stage(state)
    state["w"].add_(1.0)
    stager = saver._staging()
    second = stager.stage(state)
    assert torch.equal(second["w"], torch.arange(6.0) + 1.0) and second["groups"] == state["groups"]
    if stager_reusable(new_stager):  # torch 2.15 here; the H200's 2.11 takes the other branch
        assert stager is saver._stager and second["w"].data_ptr() == first["w"].data_ptr(), (
            "one host copy, refreshed in place"
        )
    else:
        assert saver._staging() is not stager, "a new stager for each save"

    class OneShot(DefaultStager):  # torch 2.11's behaviour: its copier closes after a stage
        def stage(self, state_dict: Any, **kwargs: Any) -> Any:
            try:
                return super().stage(state_dict, **kwargs)
            finally:
                self._state_dict_stager.close()

    def one_shot(*, pinned: bool) -> Any:
        return OneShot(new_stager(pinned=pinned)._config)

    spent = one_shot(pinned=False)
    spent.stage(state)
    with pytest.raises(KeyError):
        spent.stage(state)
    assert not stager_reusable(one_shot)
