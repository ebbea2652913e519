"""The job while its initialisers run (``initializers.InitGate``): held in ``Pending`` with
reason ``Initializing``, their pods to create; or ``Failed`` (``InitializerFailed``) once one
failed. Pure: takes a ``Decision`` and returns a new one."""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.api.models import Phase
from torchjob_operator.common import conditions as cond
from torchjob_operator.torchjob.decision import Decision
from torchjob_operator.torchjob.ending import end, finish
from torchjob_operator.torchjob.initializers import InitGate
from torchjob_operator.torchjob.observed import PodView


def holds(d: Decision, gate: InitGate) -> bool:
    """Whether the initialisers hold the job: some has not succeeded and no worker was ever
    created (once a generation was created they never run again)."""
    return not gate.done and d.created_generation is None


def initializing(d: Decision, pods: Sequence[PodView], gate: InitGate) -> Decision:
    failed = gate.failed
    if failed is not None:
        detail = cond.message(
            "InitializerFailed", kind=failed.kind, uri=failed.uri, detail=failed.message
        )
        return finish(end(d, Phase.FAILED, "InitializerFailed", detail), pods)
    d = d.but(initialize=gate.create).also(delete=gate.delete)
    return d.transition(
        Phase.PENDING, "Initializing", cond.message("Initializing", progress=gate.progress())
    )
