"""``python -m torchjob.launch._entry``: the worker process's entry point.

A separate module so that :mod:`torchjob.launch.worker` is imported once, as a
module, and its per-process state is the one user code sees.
"""

import os
import sys

from torchjob.launch.worker import main

if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: destroying a process group whose peers are gone can hang.
    os._exit(code)
