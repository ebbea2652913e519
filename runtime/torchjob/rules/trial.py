"""What a tuning trial's TorchJob trains with: the trial's config, and how it merges into a
trainer's ``train_loop_config``.

``torchjob.tune`` writes the config (``TORCHJOB_TUNE_CONFIG``) and runs trials;
``torchjob.train``'s ``TorchTrainer`` in the trial's pods reads it back. Both import it from
here, so the training layer never imports the tuning layer above it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torchjob import contract


def trial_config(environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The trial's config from ``environ`` (a trial's TorchJob pod); ``None`` elsewhere.

    Raises ``ValueError`` naming the variable when it is not a JSON object.
    """
    raw = environ.get(contract.TUNE_CONFIG)
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"environment variable {contract.TUNE_CONFIG} is not JSON: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"environment variable {contract.TUNE_CONFIG} must hold a JSON object")
    return config


def merged_loop_config(base: Mapping[str, Any] | None, config: Mapping[str, Any]) -> dict[str, Any]:
    """A trial's ``train_loop_config``: ``config["train_loop_config"]`` and every other
    top-level key but ``scaling_config``, over the trainer's own."""
    loop_config = dict(base or {})
    loop_config.update(config.get("train_loop_config") or {})
    for key, value in config.items():
        if key not in ("train_loop_config", "scaling_config"):
            loop_config[key] = value
    return loop_config


def nested_config(params: Mapping[str, Any]) -> dict[str, Any]:
    """A study's flat parameters as the trial's config: ``{"a/b": 1, "c": 2}`` ->
    ``{"a": {"b": 1}, "c": 2}`` (the TorchTune planner and its Python client both read them)."""
    config: dict[str, Any] = {}
    for path, value in params.items():
        *parents, last = path.split("/")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return config
