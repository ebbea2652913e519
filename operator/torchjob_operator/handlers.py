"""kopf's handlers, and nothing else: each hands its event to the ``Operator``.

``__main__`` builds the ``Operator`` and gives it to kopf as the ``memo`` every handler
receives (kopf's way of passing state to handlers; no module global). The work itself,
the queues, the cache, the pod watch and the leader election, is the ``Operator``'s.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import kopf

from torchjob.api.models import GROUP, PLURAL, VERSION
from torchjob.api.torchtune import PLURAL as TUNE_PLURAL
from torchjob_operator.operator import Operator


def _operator(memo: Any) -> Operator:
    return cast(Operator, memo.operator)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    op = _operator(memo)
    ours = op.settings
    # The API server wants whole seconds in timeoutSeconds.
    settings.watching.server_timeout = int(ours.watch_server_timeout_s)
    settings.watching.client_timeout = ours.watch_client_timeout_s
    settings.watching.connect_timeout = ours.watch_connect_timeout_s
    settings.posting.level = logging.WARNING  # our Events are posted by the controllers
    await op.start()


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    await _operator(memo).stop()


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    return kopf.login_via_client(**kwargs)


# Async on purpose: kopf runs sync handlers in a thread pool, and the loops live on the event loop.
@kopf.on.event(GROUP, VERSION, PLURAL)
async def torchjob_event(
    event: kopf.RawEvent, name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    _operator(memo).torchjob_event(event, namespace or "", name)


@kopf.on.event(GROUP, VERSION, TUNE_PLURAL)
async def torchtune_event(
    event: kopf.RawEvent, name: str, namespace: str | None, memo: kopf.Memo, **_: Any
) -> None:
    _operator(memo).torchtune_event(event, namespace or "", name)
