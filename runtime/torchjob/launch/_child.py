"""A forked worker's life after the fork (from the driver or from the zygote): its own
session, default signals, its environment and intra-op threads, then the worker loop; it never
returns into the forking process's code."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Mapping


def run(env: Mapping[str, str]) -> None:
    code = 1
    try:
        os.setsid()  # terminal Ctrl-C goes to the driver only; the group kills the session
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a regroup request: the worker's own
        signal.set_wakeup_fd(-1)
        os.environ.clear()
        os.environ.update(env)
        torch = sys.modules.get("torch")
        if torch is not None and env.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
        from torchjob.launch.worker import main

        code = main()
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)  # skip the driver's atexit handlers and interpreter teardown
