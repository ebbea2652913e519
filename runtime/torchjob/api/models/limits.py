"""Bounds, name patterns and Kubernetes resource quantities (docs/api.md "Bounds" lists each
bound and why)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from torchjob import contract

MAX_REPLICAS = 10_000
"""Twice Kubernetes' tested 5,000-node scale; keeps ``-worker-9999`` to 12 characters."""
MAX_NPROC_PER_NODE = 1024
"""Processes per pod: the largest nodes have 8-16 GPUs or a few hundred CPU cores."""
MAX_WAIT_SECONDS = 7 * 86400
"""Elastic waits and cooldowns: beyond a week a job is better suspended."""
MAX_BACKOFF_SECONDS = 86400
"""Restart backoff: a day; a longer pause is a suspend, not a backoff."""
MAX_BACKOFF_FACTOR = 100.0
MAX_RESTARTS = 10_000
"""Group restarts: at the shortest backoff (0 s) still bounded; more is a crash loop."""
MAX_DEADLINE_SECONDS = 2**63 - 1
"""activeDeadlineSeconds: int64, as batch/v1 Job and core/v1 Pod (no bound of our own)."""
MAX_TTL_SECONDS = 2**31 - 1
"""ttlSecondsAfterFinished: int32, as batch/v1 Job (no bound of our own)."""
MAX_PATH = 4096
"""PATH_MAX on Linux."""

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LABEL_KEY = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
JOB_NAME = DNS_LABEL
"""metadata.name: a DNS-1123 label, as the Service it names (v1.37 accepts a leading digit)."""
GPU_RESOURCE = "nvidia.com/gpu"
RESERVED_LABELS = (
    contract.LABEL_JOB_NAME,
    contract.LABEL_ROLE,
    contract.LABEL_POD_INDEX,
    contract.LABEL_GENERATION,
)
"""Labels the operator sets on every worker pod (torchjob.contract); a template may not."""

_QUANTITY = re.compile(
    r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    **{s: Decimal(1024 ** (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
}


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes resource quantity (``8``, ``"500m"``, ``"4Gi"``, ``"1e3"``) as a Decimal.

    Raises ``ValueError`` naming the value when it is not a quantity."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _QUANTITY.match(str(value).strip())
    if not m:
        raise ValueError(f"{value!r} is not a quantity (e.g. 8, 500m, 4Gi)")
    number, suffix = m.group(1), m.group(2) or ""
    try:
        if suffix[:1] in ("e", "E"):
            return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
        return Decimal(number) * _SUFFIX[suffix]
    except (InvalidOperation, OverflowError) as e:
        raise ValueError(f"{value!r} is not a quantity") from e
