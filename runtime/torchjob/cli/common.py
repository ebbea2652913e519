"""What every ``torchjob`` command shares: exit codes, error output, the API client."""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXIT_API_ERROR = 1
EXIT_USAGE = 2


def err(msg: str) -> None:
    sys.stderr.write(f"error: {msg}\n")


def client(args: argparse.Namespace) -> Any:
    from torchjob.client.client import TorchJobClient

    return TorchJobClient(
        kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace
    )


def client_group() -> str:
    from torchjob.contract import GROUP

    return GROUP
