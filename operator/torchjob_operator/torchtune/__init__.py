"""The TorchTune controller: a study of trial TorchJobs. The pure planning is
``planner.study`` (``plan_study``); ``observe`` reads, ``act`` writes, ``controller`` wires
them for the engine's work queue."""
