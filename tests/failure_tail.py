"""Each wait that failed a test, again at the very end of the session's output, shortened.

A ``tests.kube.WaitTimeout`` says what was awaited and how the world looked then: the job's
status, the namespace's pods (phase, node, conditions, containers) and Events, the operator's
log. pytest prints it in the failure's section, long before the session's last lines, and a
CI page of `make test` (five sessions side by side, hack/test.sh) often shows only those: in
CI on 2026-12-06 test_node_lost_is_a_disruption failed with a 270 s wait, and what the page
showed of the message was the tail of the operator's log, never the pods' state.

So the session ends with each such failure's message again (:func:`digest`): the line that
says what was awaited, the job's status on one line and its history (why each generation
began) on another, the pods in full, and the last few Events and operator log lines about the
test's namespace; at most :data:`MAX_LINES` lines a failure. For the failure above, a local
`make test` showed the rest in three of them: generation 2 Running, begun 2 s after
generation 1 by a "DeletionByTaintManager" disruption (test_node_lost_is_a_disruption says
why). tests/conftest.py loads the hooks in every session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Generator, Iterator
from typing import Any

import pytest

MAX_LINES = 45
"""The most lines one failure's digest takes."""
WIDTH = 300
"""The longest line kept (a pod's Unschedulable condition says why node by node)."""
TAIL = 8
"""How many of the latest Events, and of the operator log's last lines, are kept."""
SHOWN = 3
"""How many failures are shown so; any after them get their first line only (when the
cluster itself broke, every later test times out the same way)."""
SEPARATOR = "waits that timed out, again (shortened: the failure's section has it all)"
"""The heading of the section (hack/test.sh prints the section again from it)."""

_FAILED: list[tuple[str, str, str]] = []
"""(nodeid, phase, WaitTimeout message) of each failure, in order."""


def _cut(line: str, width: int = WIDTH) -> str:
    return line if len(line) <= width else line[: width - 3] + "..."


def _status_lines(head: str, block: list[str]) -> list[str]:
    """A job's status, printed as indented JSON over many lines, on one line: its plain
    fields (phase, generation, counts) first, then its lists and objects; its ``history``
    (why each generation began) on a line of its own, the latest last."""
    try:
        status = json.loads("\n".join(block))
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return [_cut(f"{head} {' '.join(line.strip() for line in block)}", 2 * WIDTH)]
    history = status.pop("history", None)
    plain = sorted(status, key=lambda k: isinstance(status[k], dict | list))
    text = json.dumps({k: status[k] for k in plain}, separators=(",", ":"))
    out = [_cut(f"{head} {text}", 2 * WIDTH)]
    if isinstance(history, list) and history:
        said = "; ".join(
            f"{r.get('generation')} {r.get('cause')}: {r.get('detail')}"
            for r in history
            if isinstance(r, dict)
        )
        cut = len(said) > 2 * WIDTH
        out.append("history: " + ("..." + said[-(2 * WIDTH - 3) :] if cut else said))
    return out


_NAMESPACE = re.compile(r"--- namespace (\S+): pods$")


def _log(lines: list[str], namespace: str | None) -> list[str]:
    """The operator log's last :data:`TAIL` lines about ``namespace`` (the test's: the
    operator reconciles every namespace), and its last line (when it last said anything)."""
    lines = [line for line in lines if line.strip()]
    mine = [line for line in lines if namespace and f"[{namespace}/" in line] or lines
    said = f"lines about {namespace}" if namespace and mine is not lines else "lines"
    shown = mine[-TAIL:]
    out = [f"operator log: {len(shown)} of its {len(mine)} {said} (in its last {len(lines)})"]
    out.extend(_cut(line) for line in shown)
    if lines and lines[-1] not in shown:
        out.append(_cut(f"... its last line: {lines[-1]}"))
    return out


def _sections(lines: list[str]) -> Iterator[tuple[str, list[str]]]:
    """The message's lines as (kind, lines): ``status`` (a heading ending in ``status:`` and
    its JSON), ``events`` (a namespace's Events), ``log`` (the operator's log), else ``text``."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.endswith(" status:") and lines[i + 1 : i + 2] in (["{"], ["null"]):
            j = i + 1  # indented JSON up to its closing brace (or "null")
            while j < len(lines) and lines[j] not in ("}", "null"):
                j += 1
            yield "status", lines[i : j + 1]
            i = j + 1
        elif line.startswith("--- namespace ") and ": events" in line:
            j = i + 1
            while j < len(lines) and lines[j].startswith("  "):
                j += 1
            yield "events", lines[i:j]
            i = j
        elif line.startswith("operator log (tail):"):
            j = i + 1  # log lines start with a date; a traceback's lines belong to them
            while j < len(lines) and not lines[j].startswith(("last value: ", "--- namespace ")):
                j += 1
            yield "log", lines[i:j]
            i = j
        else:
            yield "text", [line]
            i += 1


def digest(message: str, max_lines: int = MAX_LINES) -> list[str]:
    """``message`` (a WaitTimeout's, as ``tests.kube.wait_for`` and ``operator_harness.Jobs``
    compose it) in at most ``max_lines`` lines: the status JSON on one line and its history
    on another, the job's ``events:`` line cut to its latest, the namespace's Events and the operator log cut to
    their last :data:`TAIL` lines; every line cut to :data:`WIDTH`. A message of another
    shape keeps its first and last lines."""
    all_lines = message.splitlines()
    namespace = next((m[1] for m in map(_NAMESPACE.match, all_lines) if m), None)
    out: list[str] = []
    for kind, lines in _sections(all_lines):
        if kind == "status":
            out.extend(_status_lines(lines[0], lines[1:]))
        elif kind == "events":
            body = [line for line in lines[1:] if line.strip()]
            heading = re.sub(r" \(latest \d+\)$", "", lines[0])
            out.append(_cut(f"{heading} (the last {min(TAIL, len(body))} of {len(body)})"))
            out.extend(_cut(line) for line in body[-TAIL:])
        elif kind == "log":
            out.extend(_log(lines[1:], namespace))
        elif lines[0].startswith("events: ") and len(lines[0]) > WIDTH:
            out.append("events: ..." + lines[0][-(WIDTH - 11) :])
        else:
            out.append(_cut(lines[0]))
    if len(out) > max_lines:
        head = max_lines // 3
        skipped = len(out) - max_lines + 1
        out = [*out[:head], f"... ({skipped} lines left out)", *out[-(max_lines - head - 1) :]]
    return out


def _wait_timeout(exc: BaseException | None) -> BaseException | None:
    """The WaitTimeout that ``exc`` is, or was raised from (or while handling)."""
    from tests.kube import WaitTimeout

    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, WaitTimeout):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and call.excinfo is not None:
        timeout = _wait_timeout(call.excinfo.value)
        if timeout is not None:
            _FAILED.append((report.nodeid, report.when, str(timeout)))
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> Generator[None, None, None]:
    # Outermost: after pytest's own summary (the FAILED lines), before its last line.
    try:
        return (yield)
    finally:
        if _FAILED:
            terminalreporter.write_sep("=", SEPARATOR, red=True)
            for i, (nodeid, when, message) in enumerate(_FAILED):
                phase = "" if when == "call" else f" (in its {when})"
                terminalreporter.write_line(f"{nodeid}{phase}:")
                lines = digest(message) if i < SHOWN else message.splitlines()[:1]
                for line in lines:
                    terminalreporter.write_line(f"  {line}")
