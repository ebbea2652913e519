"""How a run survives losing workers, apart from the trainer API around it.

- ``membership``: following the job's generations from inside a pod (KeepSurvivors).
- ``survivors``: what the controller follows of the restore point and of silent peers.
- ``restore_point``: the last completed step's state, held in every worker's memory.
- ``shard_mirror`` and ``shard_rebuild``: the same for sharded (FSDP2) state, rebuilt at a
  new world size.
- ``notice``: SIGTERM in a pod given notice: train on while the replacement starts.

The public API (``TorchTrainer``, ``report``, ``Checkpoint``, ``get_context``) lives one level
up, in ``torchjob.train``; docs/runtime.md tells the whole recovery path.
"""
