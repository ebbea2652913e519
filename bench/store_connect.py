"""How late a store client that began before its server connects, once the server listens.

A joiner forms as soon as its generation is published, while the pod that will be its rank 0
still trains to its next report: it asks for that pod's TCPStore seconds before the store
listens. torch's client retries its connect with a growing backoff, so it connected seconds
after the server came up; ``torchjob.launch.store_clients.client`` first waits for the port to
listen (``store_probe.await_listening``, a connect every 50 ms) and then connects at once.

Each side: a client starts, the server (another process, torch imported ahead) listens
``lead`` seconds later; the figure is from the server's ``listen`` to the client's return,
median [min-max] of the repeats, the sides taking turns. No cluster; about a minute.

    python bench/store_connect.py [--leads 2,5,8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

SERVER = """
import sys, time, torch.distributed as dist
from datetime import timedelta
port, at = int(sys.argv[1]), float(sys.argv[2])
time.sleep(max(at - time.time(), 0))
listened = time.time()
store = dist.TCPStore("127.0.0.1", port, None, True, timedelta(seconds=60), wait_for_workers=False)
print(listened, flush=True)
sys.stdin.read()
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def once(side: str, lead_s: float) -> float:
    """Seconds from the server's listen to the client's connection, for ``side``."""
    import torch.distributed as dist

    from torchjob.launch import store_clients

    port = _free_port()
    begin = time.time() + 3.0  # the server has imported torch by then
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port), str(begin + lead_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(max(begin - time.time(), 0))
        wait = timedelta(seconds=60)
        if side == "torch":
            dist.TCPStore("127.0.0.1", port, None, False, wait)  # type: ignore[attr-defined]
        else:
            store_clients.client("bench", "127.0.0.1", port, connect=wait, timeout=wait)
            store_clients.discard("bench", "127.0.0.1", port)
        connected = time.time()
        assert server.stdout is not None
        return connected - float(server.stdout.readline())
    finally:
        server.kill()
        server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--leads", default="2,5,8", help="seconds the client begins early")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sides = ("torch", "torchjob")
    print("client began early | torch's TCPStore client | torchjob (await_listening first)")
    print("---|---|---")
    for lead in (float(x) for x in args.leads.split(",")):
        took: dict[str, list[float]] = {s: [] for s in sides}
        for _ in range(args.repeats):
            for side in sides:
                took[side].append(once(side, lead))
        cells = [
            f"{statistics.median(v):.2f} s [{min(v):.2f}-{max(v):.2f}]"
            for v in (took[s] for s in sides)
        ]
        print(f"{lead:g} s | {cells[0]} | {cells[1]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
