"""The study core: one search space, grid, encoding, sampler, pruner and objective metric for
both the local ``torchjob.tune.Tuner`` and the operator's TorchTune controller
(``torchjob_operator.torchtune``).

No torch, no kubernetes: pydantic, optuna and ``torchjob.api`` only, and optuna only in
``torchjob.search.sampling`` (imported lazily by the local tuner, so ``import torchjob.tune``
does not pay for it).

- ``space``: ``Dimension`` (one hyperparameter, in the TorchTune API's vocabulary), its
  encoding for optuna, the grid.
- ``domains``: the local API (``tune.uniform``, ``loguniform``, ``randint``, ``choice``,
  ``grid_search``) and nested ``param_space`` dicts, as dimensions.
- ``strategy``: the names a caller gives a sampler or pruner, and what each backend takes.
- ``sampling``: optuna's distributions, samplers, pruners and studies (imports optuna).
- ``metrics``: which reported metric is the objective (``validation_loss`` = ``val_loss``),
  and which value is better.
"""
