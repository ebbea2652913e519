"""A study whose trials are TorchJobs: 4 learning rates x 2 workers each, 2 TorchJobs at a time.

    python examples/tune/study.py [--namespace NS] [--template examples/tune/trial-job.yaml]

Needs a cluster running the torchjob operator and an image holding examples/tune/trial.py.
``tune.run`` submits the search as a TorchTune named ``lr-study`` (the same study as
examples/tune/torchtune.yaml) that the operator runs, and waits for it: stop this script and
``tune.attach("lr-study")`` or ``kubectl get tt lr-study`` follows it still. Trials whose loss
is above 5 at a report are pruned (optuna's threshold pruner, in the operator): their TorchJobs
are deleted. The best config and its checkpoint come back here.
"""

import argparse

from torchjob import tune


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--template", default="examples/tune/trial-job.yaml")
    parser.add_argument("--kubeconfig", default=None)
    args = parser.parse_args()
    analysis = tune.run(
        None,
        config={
            "lr": tune.grid_search([0.1, 0.05, 0.001, 0.0005]),
            "epochs": 6,
            "steps": 10,
            "epoch_seconds": 0.5,
        },
        metric="loss",
        mode="min",
        scheduler={"type": "threshold", "upper": 5.0},  # the TorchTune's spec.pruner
        max_concurrent_trials=2,
        name="lr-study",
        tune_config=tune.TuneConfig(
            backend="cluster",
            template=args.template,
            namespace=args.namespace,
            kubeconfig=args.kubeconfig,
        ),
        raise_on_failed_trial=False,
    )
    for trial in analysis.trials:
        print(f"trial {trial.trial_id} {trial.status}: lr={trial.config['lr']} {trial.last_result}")
    print(f"best config: {analysis.best_config}")
    print(f"best checkpoint: {analysis.best_checkpoint}")


if __name__ == "__main__":
    main()
