"""How often ``report()`` takes the in-memory restore point (issue 39 item 4).

A restore point is one copy of the registered state into host memory. For a small model it
is free and every report takes one (a loss then costs at most the step in flight). For a
real one it is not: docs/runtime.md measures about 112 ms per 128 MiB, so a 512 MiB state
reported every 0.5 s would spend most of the training time copying. ``Cadence`` keeps the
copies within a stated share of the training time (``TORCHJOB_RESTORE_POINT_BUDGET``,
default 2 %) by taking one every ``k`` reports:

    k = ceil(copy time / (budget x time between reports))

(a state under 8 MiB, :data:`FREE_BYTES`, is copied at every report), and a loss then
costs up to ``k - 1`` reports of steps (redone from the last restore
point), which :attr:`Cadence.every` says and ``report()`` passes on. ``TORCHJOB_RESTORE_POINT_EVERY``
fixes ``k`` instead (``1``: every report, whatever it costs).

A process's first copy allocates the buffers the later ones reuse: it is not counted (the
next report copies again, into them). The estimate must not move on one slow copy either: a
process starved of CPU for a moment would otherwise skip hundreds of restore points. So the
copy time is the *lower median* of the last few copies (one stall among them moves it by one
place) and the interval the *median* of the last few (a stall lengthens it, which only lowers
``k``). Not the fastest copy: where a machine's cores are shared (8 workers on 2 cores, the
benchmark's fleet) most copies run beside the others' and take 2-5 times the fastest one
(bench/results/2026-11-30d: 252 MiB in 28-151 ms), and that slower copy is what the job pays.
On the CPU the overlapped part of a copy is not free: its thread's CPU time is counted too,
in the step's currency (:meth:`Cadence.beside`). Pure: the caller passes the clock readings.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

MIN_CPU_RATE = 0.05
"""The least share of a core :meth:`Cadence.beside` assumes a process had (a process that
mostly waits would otherwise turn a few ms of copying into seconds)."""
VOTE_SLOTS = 64
"""Votes of ``k`` from 1 to this one are told apart in :meth:`Cadence.vote` (one slot each,
summed in ``report()``'s all-reduce, so the group learns the largest)."""
VOTE_LEN = 2 + VOTE_SLOTS
"""The length of a :meth:`Cadence.vote`."""
NO_VOTE = (0,) * VOTE_LEN
"""The vote of a rank that has none (no copy measured, a fixed ``k``, no state registered)."""
WINDOW = 8
"""Copies and intervals remembered."""
FREE_BYTES = 8 * 2**20
"""A state this small is copied at every report whatever the budget says (under 8 ms at the
~0.9 ms per MiB measured here; a small model's steps can be shorter than its copy, and
skipping them would buy nothing). Decided by size, not by time, so that a starved machine,
where every copy is slow, never changes what a small job's loss costs."""


@dataclass
class Cadence:
    """One training function's restore-point cadence (``budget``: the share of training time
    the copies may take; ``fixed``: every ``fixed`` reports instead, when set)."""

    budget: float = 0.02
    fixed: int | None = None
    copies: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    reports: int = 0
    """Reports seen (:meth:`due`): their number where the caller gives none."""
    last_report_s: float | None = None
    last_copy_s: float = 0.0
    said: int = 1
    """The ``every`` last announced (:meth:`news`)."""
    nbytes: int = 0
    """The size of the last copy."""
    taken: bool = False
    """A restore point was taken (the first report takes one whatever the cadence)."""

    cpu_rates: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    """CPU seconds the process used per second between reports (:meth:`due`'s ``cpu_s``)."""
    last_cpu_s: float | None = None

    agreed: int | None = None
    """The group's ``k`` (:meth:`agree`): every rank copies at the same reports."""
    sampled: bool = False
    """The last copy is a sample in :attr:`copies` (it did not allocate its buffers)."""

    @property
    def every(self) -> int:
        """Take a restore point every this many reports: the user's, else the group's, else
        this process's own (:attr:`own_every`)."""
        if self.fixed is not None:
            return self.fixed
        return self.agreed if self.agreed is not None else self.own_every

    @property
    def own_every(self) -> int:
        """``k`` from this process's copies and intervals (1 until both are known)."""
        if not self.copies or not self.intervals or self.nbytes <= FREE_BYTES:
            return 1
        interval = statistics.median(self.intervals)
        if interval <= 0:
            return 1
        return max(1, math.ceil(self.copy_s / (self.budget * interval)))

    @property
    def copy_s(self) -> float:
        """What a copy costs: the lower median of the last few (0 before any)."""
        return statistics.median_low(self.copies) if self.copies else 0.0

    def due(self, now_s: float, report: int | None = None, cpu_s: float | None = None) -> bool:
        """At a report (``now_s``: a monotonic clock): whether it takes the restore point.
        Every report does until one copy into buffers already there was measured (the
        first copy allocates them: see :meth:`took`). ``report``: the report's number in
        the group (from 1), the same on every rank: the copies fall on reports 1, 1 + k,
        1 + 2k, ..., so ranks that began measuring a report apart (a replacement that took
        over a slot's buffers) still copy at the same reports; without it, the number of
        reports this cadence saw. ``cpu_s``: the process's CPU time now (every thread's),
        for :meth:`beside`."""
        if cpu_s is not None:
            if self.last_cpu_s is not None and self.last_report_s is not None:
                wall = now_s - self.last_report_s
                if wall > 0:
                    self.cpu_rates.append(max(cpu_s - self.last_cpu_s, 0.0) / wall)
            self.last_cpu_s = cpu_s
        if self.last_report_s is not None:
            # The training time between two reports, without the copy made at the first.
            self.intervals.append(max(now_s - self.last_report_s - self.last_copy_s, 0.0))
        self.last_report_s = now_s
        self.last_copy_s = 0.0
        self.reports += 1
        # The first report copies; under the budget, so does each until a copy into buffers
        # already there was measured.
        measuring = self.fixed is None and not self.copies
        k = self.every
        n = self.reports if report is None else report
        turn = (n - 1) % k == 0
        return not self.taken or measuring or turn

    def took(self, seconds: float, nbytes: int, allocated: bool = False) -> None:
        """The restore point of this report was taken: ``nbytes`` in ``seconds``.
        ``allocated``: it allocated its buffers (a process's first restore point, or a state
        that changed shape). Such a copy is no sample of what a copy costs: it pays for
        fresh pages as well (on the 2-core machine, busy, a first copy of 252 MiB took
        seconds where the next took 0.08 s, so k came out in the dozens and a loss lost 17
        steps where it should have lost one); the next report then copies again."""
        self.last_copy_s = seconds
        self.nbytes = nbytes
        self.taken = True
        self.sampled = not allocated
        if allocated:
            return
        self.copies.append(seconds)

    def waited(self, seconds: float) -> None:
        """The loop waited ``seconds`` for the last copy's overlapped part
        (``recovery.host_copy``: what the next forward and backward did not cover): part of
        what that copy cost, and not training time."""
        if seconds <= 0:
            return
        self.last_copy_s += seconds
        if self.sampled and self.copies:
            self.copies[-1] += seconds

    def beside(self, cpu_s: float) -> None:
        """The last copy's thread spent ``cpu_s`` of CPU copying host tensors beside the
        next step (``recovery.host_copy.cpu_beside``; a GPU's copies run on a side stream
        and add none). A step on the CPU had those cores (torch's threads take all it may),
        so the copy cost more than the loop waited for it: the fleet bench's loop waited
        2-5 ms per 252 MiB copy, k came out 1, and its baseline ran 4.8-8.3 % slower than
        without restore points (bench/results/2026-12-06p). In the step's currency, a CPU
        second taken from a process that gets ``r`` CPU seconds a second (:attr:`cpu_rates`:
        its share of the cores, 0.25 for 8 workers on 2 cores) is ``1 / r`` seconds of its
        training lost. The interval keeps the slower step."""
        if cpu_s <= 0 or not (self.sampled and self.copies):
            return
        rate = statistics.median(self.cpu_rates) if self.cpu_rates else 1.0
        self.copies[-1] += cpu_s / max(rate, MIN_CPU_RATE)

    def vote(self) -> list[int]:
        """This process's vote for the group's agreement, to be summed over the ranks
        (:data:`VOTE_LEN` counts): ``k``, 1, then a 1 in slot ``min(k, VOTE_SLOTS)`` of
        :data:`VOTE_SLOTS`; all zeros before it measured a copy (a rank that has not voted
        does not count)."""
        if self.fixed is not None or not self.copies:
            return list(NO_VOTE)
        k = self.own_every
        slots = [0] * VOTE_SLOTS
        slots[min(k, VOTE_SLOTS) - 1] = 1
        return [k, 1, *slots]

    def agree(self, summed: Sequence[int]) -> None:
        """Every rank's :meth:`vote`, summed: ``k`` is the largest any rank voted. Each rank
        alone would copy at its own reports, and a collective waits for whichever rank
        copies, so the job would pay every rank's copies; agreed, every rank copies at the
        same reports, and a round of copies costs the group what the slowest rank's copy
        costs, since the next collective waits for it. ``k`` from the ranks' mean held the
        budget only where every rank's copy cost the same: on the fleet bench rank 0's own
        ``k`` was 4-7 where the ranks' mean was 6-8 (other ranks voted above it), and the
        baselines with restore points ran 2.3 % below those without (the median of three
        parts, timed by their steps), against a budget of 2 % (bench/results/2026-12-07b, d,
        f). A vote above :data:`VOTE_SLOTS` counts in the last slot, so above it ``k`` is
        at least that and at least the ranks' mean, rounded up."""
        k_sum, voters, *slots = summed
        if voters <= 0:
            return
        largest = max((i + 1 for i, n in enumerate(slots) if n > 0), default=1)
        self.agreed = max(1, largest, math.ceil(k_sum / voters))

    def news(self, in_place: bool = False) -> str | None:
        """A line for the log when ``every`` changed since it was last said (None if not):
        what a restore point costs, and what a loss now costs (``in_place``: a loss in the
        step's all-reduce costs that step alone, ``recovery.step_undo``)."""
        k = self.every
        if k == self.said:
            return None
        self.said = k
        if self.fixed is not None:
            why = "TORCHJOB_RESTORE_POINT_EVERY"
        else:
            interval = statistics.median(self.intervals) if self.intervals else 0.0
            group = "the slowest rank's; here " if self.agreed is not None else ""
            why = (
                f"{group}a copy of {self.nbytes / 2**20:.0f} MiB takes "
                f"{self.copy_s * 1000:.0f} ms, "
                f"{interval * 1000:.0f} ms of training between reports, "
                f"budget {self.budget:.0%}"
            )
        cost = f"a loss costs up to {k - 1} step(s)"
        if in_place and k > 1:
            cost = (
                f"a loss in a step's all-reduce costs that step (undone), elsewhere up to {k - 1}"
            )
        return f"restore point every {k} report(s) ({why}): {cost}"
