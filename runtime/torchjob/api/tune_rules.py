"""The rule table of the TorchTune API: each rule written once, its CEL for the CRD and its
Python check for pydantic, as ``torchjob.api.models.rules`` is for a TorchJob.

``tune_cel`` gives a schema of ``torchjob.api.torchtune`` its ``x-kubernetes-validations`` (and
``crd.build_tune_crd`` the object's); ``enforce_tune`` is what its model validators call, so
``TorchTune.model_validate`` refuses what the API server would, with the same message. A trial
template's spec is a TorchJob spec: the TorchJob's own table checks it.

Not here: "categorical and grid need values" (an OpenAPI ``anyOf`` of ``Parameter``'s schema:
CEL cannot see the untyped ``values``) and the int64 bound of ``activeDeadlineSeconds`` (the
schema's ``format``); their models check them too.
"""

from __future__ import annotations

from typing import Any

from torchjob.api.models.rule import Rule, cel_on, enforce_rules
from torchjob.api.models.rule_parts import NAME_IS_LABEL, NAME_MUST

MAX_STUDY_NAME = 40
"""Trial TorchJobs are named ``<study>-t<number>``: 40 + 6 characters leave room for the
workers' ``-worker-<index>`` suffixes within the 63 of a hostname."""
NUMERIC = ("uniform", "loguniform", "int")
"""The parameter types sampled from ``low``..``high``."""
ENUMERATED = ("grid", "categorical")
"""The parameter types that list their ``values``: all a grid sampler can enumerate."""
STUDY_NAME = (
    "metadata.name: it begins the name of every trial TorchJob, which only the operator creates"
)


def _cel_list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def _numeric(p: Any) -> bool:
    return p.type.value in NUMERIC


def _grid_sampler(s: Any) -> bool:
    return bool(s.sampler.type.value == "grid")


TUNE_RULES: tuple[Rule, ...] = (
    Rule(
        "study-name",
        on="TorchTune",
        cel=NAME_IS_LABEL,
        message=f"{NAME_MUST} (it begins the name of every trial TorchJob)",
        unchecked=STUDY_NAME,
    ),
    Rule(
        "study-name-length",
        on="TorchTune",
        cel=f"size(self.metadata.name) <= {MAX_STUDY_NAME}",
        message=(
            f"metadata.name is too long: at most {MAX_STUDY_NAME} characters, so that the "
            "trial TorchJobs (<name>-t<number>) and their pods' hostnames fit in 63"
        ),
        unchecked=STUDY_NAME,
    ),
    Rule(
        "parameter-bounds",
        on="Parameter",
        cel=(
            f"!(self.type in {_cel_list(NUMERIC)}) || "
            "(has(self.low) && has(self.high) && self.low < self.high)"
        ),
        message=(
            "spec.searchSpace[].low and high are required for uniform, loguniform and int, "
            "with low < high"
        ),
        check=lambda p: (
            not _numeric(p) or (p.low is not None and p.high is not None and p.low < p.high)
        ),
    ),
    Rule(
        "parameter-log-low",
        on="Parameter",
        cel="self.type != 'loguniform' || !has(self.low) || self.low > 0.0",
        message="spec.searchSpace[].low must be > 0 for a loguniform parameter",
        check=lambda p: p.type.value != "loguniform" or p.low is None or p.low > 0,
    ),
    Rule(
        "pruner-threshold",
        on="Pruner",
        cel="self.type != 'threshold' || has(self.lower) || has(self.upper)",
        message="spec.pruner: a threshold pruner needs lower or upper",
        check=lambda p: p.type.value != "threshold" or p.lower is not None or p.upper is not None,
    ),
    Rule(
        "search-space-not-empty",
        on="TorchTuneSpec",
        cel="size(self.searchSpace) > 0",
        message="spec.searchSpace must list at least one parameter",
        check=lambda s: len(s.search_space) > 0,
    ),
    Rule(
        "grid-needs-grid-sampler",
        on="TorchTuneSpec",
        cel=(
            "!self.searchSpace.exists(p, p.type == 'grid') || "
            "(has(self.sampler) && self.sampler.type == 'grid')"
        ),
        message=(
            "spec.sampler.type must be grid when spec.searchSpace has a grid parameter (tpe, "
            "random and cmaes sample; they cannot enumerate a grid)"
        ),
        check=lambda s: _grid_sampler(s) or all(p.type.value != "grid" for p in s.search_space),
    ),
    Rule(
        "grid-sampler-enumerates",
        on="TorchTuneSpec",
        cel=(
            "!has(self.sampler) || self.sampler.type != 'grid' || "
            f"self.searchSpace.all(p, p.type in {_cel_list(ENUMERATED)})"
        ),
        message=(
            "spec.searchSpace: the grid sampler enumerates only grid and categorical "
            "parameters; give the others type grid with values, or choose another "
            "spec.sampler.type"
        ),
        check=lambda s: (
            not _grid_sampler(s) or all(p.type.value in ENUMERATED for p in s.search_space)
        ),
    ),
    Rule(
        "parameter-names-unique",
        on="TorchTuneSpec",
        cel="self.searchSpace.all(p, self.searchSpace.exists_one(q, q.name == p.name))",
        message="spec.searchSpace[].name must be unique",
        check=lambda s: len({p.name for p in s.search_space}) == len(s.search_space),
    ),
)
"""Every rule of the TorchTune API, in the order each schema lists them and each validator
checks them."""


def tune_cel(on: str, field: str = "") -> list[Any]:
    """The ``x-kubernetes-validations`` of ``on`` (or of its property ``field``)."""
    return cel_on(TUNE_RULES, on, field)


def enforce_tune(subject: str, obj: object) -> None:
    """Raise the first rule on ``subject`` that ``obj`` breaks (``ValueError``, its message)."""
    enforce_rules(TUNE_RULES, subject, obj)
