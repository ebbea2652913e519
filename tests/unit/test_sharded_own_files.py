"""Which files of a sharded (DCP) checkpoint a rank wrote (``torchjob.train._sharded``): from
the metadata ``save`` returned, or, where that holds no ``storage_data`` (torch 2.11's async
save of a GPU state returned such a one), from the checkpoint's own ``.metadata``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

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
