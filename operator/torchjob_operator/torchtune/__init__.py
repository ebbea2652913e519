"""The TorchTune controller: a hyperparameter study whose trials are TorchJobs.

Pure planning (``plan``, ``trials``, ``replay``): the study's next status and actions from
the TorchTune and its trial TorchJobs, with the study core (``torchjob.search``).
``observe`` reads, ``act`` writes, ``controller`` wires them for the engine's work queue.
"""
