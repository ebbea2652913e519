"""A TorchJob spec over its runtime blueprint: the merge, and the errors of the merged spec.

Pure (dicts in, a dict or a ``TorchJobSpec`` out); the operator resolves a job's
``spec.runtimeRef`` with it once, when the job starts, and ``torchjob submit`` checks a job
against a blueprint it can read. Kubernetes' strategic-merge conventions:

=========================================  ==================================================
what                                       result
=========================================  ==================================================
a field only one side sets                 that side's value
a scalar both set (``nprocPerNode``,       the job's
``image``, ``command``, ``replicas`` ...)
an object both set (``elastic``,           merged field by field, by these same rules
``failurePolicy``, ``resources``, labels)
``containers``, ``initContainers``,        merged by ``name``: an item of the job whose name
``env``, ``volumes``,                      the blueprint has is merged into it (these rules
``imagePullSecrets``                       again); the others are appended after the
                                           blueprint's, in the job's order
``volumeMounts``, ``ports``                likewise by ``mountPath``, ``containerPort``
any other list (``args``, ``tolerations``,  the job's replaces the blueprint's
``permanentExitCodes`` ...)
=========================================  ==================================================

The merged spec is then checked by the same models and rule table as a TorchJob written in
full; an error names the field and the side its value came from.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from torchjob.api.models import TorchJobSpec

MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
"""The lists merged item by item, and the key that identifies an item (as in Kubernetes'
``patchMergeKey``)."""

_MISSING: Any = object()


class MergeError(ValueError):
    """The merged spec is invalid: ``field`` (``spec.…``), ``side`` (``the job``,
    ``ClusterTorchRuntime gpu`` or both) and the rule's ``message``."""

    def __init__(self, field: str, side: str, message: str) -> None:
        self.field, self.side, self.message = field, side, message
        super().__init__(f"{field}: {message} (from {side})")


def merge_spec(blueprint: Mapping[str, Any], job: Mapping[str, Any]) -> dict[str, Any]:
    """The job's spec over the blueprint's (the table above), without ``runtimeRef``."""
    merged = _merge(dict(blueprint), {k: v for k, v in job.items() if k != "runtimeRef"}, "")
    return dict(merged)


def _merge(base: Any, over: Any, field: str) -> Any:
    if isinstance(base, Mapping) and isinstance(over, Mapping):
        out = {k: copy.deepcopy(v) for k, v in base.items()}
        for k, v in over.items():
            out[k] = _merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    key = MERGE_KEYS.get(field)
    if key and _keyed(base, key) and _keyed(over, key):
        mine = {item[key]: item for item in over}
        out_list = [
            _merge(item, mine.pop(item[key]), "") if item[key] in mine else copy.deepcopy(item)
            for item in base
        ]
        return out_list + [copy.deepcopy(item) for item in over if item[key] in mine]
    return copy.deepcopy(over)


def _keyed(items: Any, key: str) -> bool:
    """A list of objects that all carry ``key`` (anything else is replaced whole)."""
    return isinstance(items, list) and all(isinstance(i, Mapping) and key in i for i in items)


def resolve(blueprint: Mapping[str, Any], job: Mapping[str, Any], *, source: str) -> TorchJobSpec:
    """The merged spec, checked as a TorchJob's; ``source`` names the blueprint in errors
    (``ClusterTorchRuntime gpu``). Raises ``MergeError`` for the first problem."""
    merged = merge_spec(blueprint, job)
    _check_images(merged, blueprint, job, source)
    try:
        return TorchJobSpec.model_validate(merged)
    except ValidationError as err:
        first = err.errors()[0]
        msg = str(first["msg"]).removeprefix("Value error, ")
        loc = _deeper(_clean(first["loc"], merged), msg, merged)
        raise MergeError(_field(loc), side_of(loc, merged, blueprint, job, source), msg) from None


def _check_images(
    merged: Mapping[str, Any], blueprint: Mapping[str, Any], job: Mapping[str, Any], source: str
) -> None:
    """A container without an image is the usual mistake: a job container named unlike the
    blueprint's is a new container, not an override. Say so."""
    pod = (merged.get("template") or {}).get("spec") or {}
    for field in ("containers", "initContainers"):
        for i, c in enumerate(pod.get(field) or []):
            if isinstance(c, Mapping) and not str(c.get("image") or "").strip():
                loc = ("template", "spec", field, i, "image")
                side = side_of(loc[:-1], merged, blueprint, job, source)
                theirs = [
                    str(b.get("name"))
                    for b in ((blueprint.get("template") or {}).get("spec") or {}).get(field) or []
                    if isinstance(b, Mapping)
                ]
                hint = (
                    f"; {source}'s {field}: {', '.join(theirs)} (a job's container overrides "
                    "the blueprint's of the same name)"
                    if side == "the job" and theirs
                    else ""
                )
                raise MergeError(
                    _field(loc),
                    side,
                    f"container image is required: container {c.get('name')!r} has none{hint}",
                )


def _clean(loc: Sequence[Any], merged: Mapping[str, Any]) -> tuple[Any, ...]:
    """The error's location in the document: without pydantic's union branch tags
    (``nprocPerNode.constrained-int``), which name no field."""
    node: Any = merged
    out: list[Any] = []
    for part in loc:
        if isinstance(node, Mapping) and isinstance(part, str):
            node = node.get(part, _MISSING)
        elif isinstance(node, list) and isinstance(part, int):
            node = node[part] if part < len(node) else _MISSING
        elif node is not _MISSING:
            continue  # a union tag below a value
        out.append(part)
    return tuple(out)


_NAMED = re.compile(r"\bspec((?:\.[A-Za-z]+)+)")


def _deeper(loc: tuple[Any, ...], msg: str, merged: Mapping[str, Any]) -> tuple[Any, ...]:
    """A model's rule is reported on the model (``spec.template``); its message names the
    field (``spec.template.spec.restartPolicy must be Never``): that field, when it lies
    below and is set, tells the side better. Rules across the whole spec keep ``spec``."""
    found = _NAMED.search(msg)
    if not loc or found is None:
        return loc
    parts = tuple(found.group(1).strip(".").split("."))
    if len(parts) <= len(loc) or parts[: len(loc)] != loc:
        return loc
    node: Any = merged
    for part in parts:
        node = node.get(part, _MISSING) if isinstance(node, Mapping) else _MISSING
    return parts if node is not _MISSING else loc


def _field(loc: Sequence[Any]) -> str:
    out = "spec"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def side_of(
    loc: Sequence[Any],
    merged: Mapping[str, Any],
    blueprint: Mapping[str, Any],
    job: Mapping[str, Any],
    source: str,
) -> str:
    """Which side the merged spec's value at ``loc`` came from: ``the job``, ``source`` (the
    blueprint), ``the job over <source>`` (both set it; merged, or the job's value won) or
    ``neither the job nor <source>`` (a required field nobody set)."""
    m: Any = merged
    b: Any = blueprint
    j: Any = job
    parent = ""
    for part in loc:
        if isinstance(part, int):
            m, b, j = _item(m, b, j, part, parent)
        else:
            m, b, j = (_get(x, part) for x in (m, b, j))
            parent = str(part)
    if j is not _MISSING and b is not _MISSING:
        return f"the job over {source}"
    if j is not _MISSING:
        return "the job"
    if b is not _MISSING:
        return source
    return f"neither the job nor {source}"


def _get(node: Any, key: str) -> Any:
    return node.get(key, _MISSING) if isinstance(node, Mapping) else _MISSING


def _item(m: Any, b: Any, j: Any, i: int, field: str) -> tuple[Any, Any, Any]:
    """Item ``i`` of a merged list, and the items of each side it came from."""
    item = m[i] if isinstance(m, list) and i < len(m) else _MISSING
    key = MERGE_KEYS.get(field)
    if key and isinstance(item, Mapping) and key in item:
        return item, _find(b, key, item[key]), _find(j, key, item[key])
    if isinstance(j, list):  # the job's list replaced the blueprint's
        return item, _MISSING, j[i] if i < len(j) else _MISSING
    return item, b[i] if isinstance(b, list) and i < len(b) else _MISSING, _MISSING


def _find(items: Any, key: str, value: Any) -> Any:
    if not isinstance(items, list):
        return _MISSING
    return next((x for x in items if isinstance(x, Mapping) and x.get(key) == value), _MISSING)


__all__ = ["MERGE_KEYS", "MergeError", "merge_spec", "resolve", "side_of"]
