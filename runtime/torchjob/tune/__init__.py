"""torchjob.tune: hyperparameter search over distributed trials, with optuna.

::

    from torchjob import tune
    tuner = tune.Tuner(
        trainer_or_trainable,
        param_space={"train_loop_config": {"lr": tune.loguniform(1e-4, 1e-1)}},
        tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=8),
    )
    best = tuner.fit().get_best_result()

The seeds' ``tune.run(trainable, config=..., num_samples=..., stop=...)`` is
the same engine behind another door; it returns an :class:`ExperimentAnalysis`.
Seed 001's ``DistributedTrainableCreator``, ``distributed_checkpoint_dir``,
``checkpoint_dir`` and ``is_distributed_trainable`` are here too, and
``TuneConfig(backend="cluster", template=...)`` submits the search as a TorchTune that the
operator runs, every trial a TorchJob (``attach(name)`` follows it again); see docs/sgd.md.
"""

from torchjob.search.domains import choice, grid_search, loguniform, randint, uniform
from torchjob.tracking.callback import Callback
from torchjob.tune.analysis import TuneError, run
from torchjob.tune.cluster import Study, attach, study_manifest, submit
from torchjob.tune.result import ExperimentAnalysis, Result, ResultGrid, Trial
from torchjob.tune.session import (
    TrialPruned,
    TrialStopped,
    checkpoint_dir,
    distributed_checkpoint_dir,
    get_trial_config,
    get_trial_dir,
    is_distributed_trainable,
    report,
)
from torchjob.tune.trainables import DistributedTrainable, DistributedTrainableCreator, Trainable
from torchjob.tune.tuner import RunConfig, TuneConfig, Tuner

__all__ = [
    "Callback",
    "DistributedTrainable",
    "DistributedTrainableCreator",
    "ExperimentAnalysis",
    "Result",
    "ResultGrid",
    "RunConfig",
    "Study",
    "Trainable",
    "Trial",
    "TrialPruned",
    "TrialStopped",
    "TuneConfig",
    "TuneError",
    "Tuner",
    "attach",
    "checkpoint_dir",
    "choice",
    "distributed_checkpoint_dir",
    "get_trial_config",
    "get_trial_dir",
    "grid_search",
    "is_distributed_trainable",
    "loguniform",
    "randint",
    "report",
    "run",
    "study_manifest",
    "submit",
    "uniform",
]
