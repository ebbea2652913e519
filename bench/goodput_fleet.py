"""A fleet that provisions a new node for each one it loses (``--spares``; issue 39).

Without spares (the bench before 2026-12-06), a lost node is its own replacement: it comes
back ``--node-return`` seconds after it is gone. For a vanish that is what a fleet does (the
cloud's autoscaler learns of the loss when the instance is gone); for a notice it is not.
Karpenter, on a spot interruption warning, taints and drains the node *and* launches its
replacement at once, so the new node is Ready while the doomed one still runs
(karpenter.sh, "Disruption": interruption handling); an Auto Scaling group with capacity
rebalancing does the same from the rebalance recommendation. Counted from the gone node, a
row with three spot nodes had every one of them noticed or gone for 7-9 % of its window
(bench/goodput_ceiling.py), time no policy can train through at full size.

With ``--spares N``, N of the spot nodes stand for VMs not yet provisioned: each carries
:data:`SPARE_TAINT` (NoSchedule; no job tolerates it, so no pod goes there and the operator
counts it as no place for one, as it would a node that does not exist yet). When a loss
strikes with notice, :meth:`Fleet.provision_after` untaints a spare ``--provision`` seconds
later (60 s by default: Karpenter polls its interruption queue, then EC2 launches and the
kubelet joins): the new VM, Ready. The noticed node, once gone, comes back ``--node-return``
seconds later *as a spare* (tainted before it returns): its slot in the pool, not a node
the job may use. The job sees the same number of usable spot nodes as without spares,
but the replacement of a noticed node arrives during the notice. A provision that finds no
spare back yet waits for one (the fleet short of capacity, as a cloud can be) and says how
long it waited (``provisioned`` in the trace, ``waited``).

A vanish row keeps its spares idle and tainted: its node comes back itself ``--node-return``
seconds after it is gone, as without spares (the fleet learns of a vanished node when it is
gone), so the vanish rows read the same with or without spares. ``--spares`` needs enough
spot nodes that a notice rarely finds the pool dry: the job's 3 nodes and 3 spares
(``TORCHJOB_REAL_NODES=7`` with the system node) cover three notices within one node's
absence.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SPARE_TAINT = "bench.torchjob.io/unprovisioned"
"""The taint (NoSchedule) of a spot node standing for a VM the fleet has not provisioned."""
POLL_S = 1.0
"""How often a provision looks again for a spare that is back."""


def has_spare_taint(node: Any) -> bool:
    return any(t.key == SPARE_TAINT for t in node.spec.taints or ())


def _ready(node: Any) -> bool:
    conditions = node.status.conditions or ()
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def choose_spares(spot: Sequence[str], tainted: Sequence[str], count: int) -> list[str]:
    """Which ``count`` of the ``spot`` nodes are spares for a row: those already tainted
    first (a row keeps the pool the last one left), then the last by name. Pure."""
    if not 0 <= count < len(spot):
        raise ValueError(
            f"--spares {count}: needs at least one spot node to train on beside the spares "
            f"({len(spot)} spot nodes: TORCHJOB_REAL_NODES counts them with the system node)"
        )
    kept = [n for n in spot if n in tainted][:count]
    rest = [n for n in sorted(spot, reverse=True) if n not in kept]
    return sorted(kept + rest[: count - len(kept)])


def _set_taint(core: Any, name: str, on: bool) -> None:
    taints = [t for t in core.read_node(name).spec.taints or () if t.key != SPARE_TAINT]
    if on:
        taints.append({"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"})
    core.patch_node(name, {"spec": {"taints": taints}})


@dataclass
class Fleet:
    """The spot nodes of a row with spares: provisions one for each loss."""

    core: Any
    delay: float
    """Seconds from a notice to its replacement's provision (``--provision``)."""
    note: Callable[..., None] = lambda what, **fields: None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _claimed: set[str] = field(default_factory=set)
    """Spares untainted by a provision (or about to be): never claimed twice."""
    _away: set[str] = field(default_factory=set)
    """Lost nodes retired as spares and not yet back (their Ready may still be stale)."""

    @classmethod
    def for_row(
        cls, core: Any, spot: Sequence[str], count: int, delay: float, note: Callable[..., None]
    ) -> Fleet:
        """Make ``count`` of ``spot`` the row's spares (tainted; the others untainted) and
        record the row's fleet in the trace (``fleet``: the nodes the job may use, the
        spares)."""
        tainted = [n for n in spot if has_spare_taint(core.read_node(n))]
        spares = choose_spares(spot, tainted, count)
        for name in spot:
            if (name in spares) != (name in tainted):
                _set_taint(core, name, name in spares)
        note("fleet", live=sorted(set(spot) - set(spares)), spares=spares)
        return cls(core, delay, note)

    def retire(self, node: str) -> None:
        """``node`` is gone: it comes back as a spare (tainted while it is still away; it may
        be claimed once :meth:`back`)."""
        with self._lock:
            self._away.add(node)
            self._claimed.discard(node)
        _set_taint(self.core, node, True)

    def back(self, node: str) -> None:
        """``node``, retired, is back: a spare a provision may claim."""
        with self._lock:
            self._away.discard(node)

    def provision_after(self, lost: str, stop: threading.Event) -> threading.Thread:
        """In the background, :attr:`delay` seconds from now, untaint a spare that is back
        and Ready (waiting for one if none is): ``lost``'s replacement."""

        def provision() -> None:
            asked = time.time() + self.delay
            if stop.wait(self.delay):
                return
            while not stop.is_set():
                node = self._claim()
                if node is not None:
                    _set_taint(self.core, node, False)
                    waited = round(time.time() - asked, 1)
                    self.note("provisioned", node=node, replaces=lost, waited=waited)
                    return
                stop.wait(POLL_S)

        thread = threading.Thread(target=provision, name=f"provision-{lost}", daemon=True)
        thread.start()
        return thread

    def _claim(self) -> str | None:
        """A spare that is back and Ready, claimed for one provision."""
        for node in self.core.list_node().items:
            name = node.metadata.name
            if not has_spare_taint(node) or not _ready(node):
                continue
            with self._lock:
                if name in self._claimed or name in self._away:
                    continue
                self._claimed.add(name)
            return name
        return None


__all__ = ["SPARE_TAINT", "Fleet", "choose_spares", "has_spare_taint"]
