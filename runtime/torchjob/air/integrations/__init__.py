"""``ray.air.integrations``: ``mlflow`` (``setup_mlflow``, ``MLflowLoggerCallback``) and
``wandb`` (``setup_wandb``, ``WandbLoggerCallback``)."""
