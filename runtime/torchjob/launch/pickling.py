"""How the driver pickles what a worker runs: cloudpickle, keeping each function's file name.

cloudpickle writes the code of a function it pickles by value (one from ``__main__``: a
script's, a notebook's) with the file name ``<dynamic-code>``, so that the same function
pickles to the same bytes wherever it was defined. A worker's traceback then names no file
and shows no source line for the user's own frames. The bytes here are sent once per task,
never compared, so :func:`dumps` keeps the file name: the worker's traceback (printed by the
driver, ``errors.RemoteTraceback``) shows ``File "train.py", line 42`` and the line itself
where the worker can read the file (a laptop, or a pod whose image holds the script).
"""

from __future__ import annotations

import io
import types
from collections import ChainMap
from typing import Any

import cloudpickle

_DYNAMIC = "<dynamic-code>"
_code_reduce = cloudpickle.Pickler.dispatch_table.get(types.CodeType)


def _code_keeping_filename(code: types.CodeType) -> Any:
    rebuild, args = _code_reduce(code)
    return rebuild, tuple(code.co_filename if a == _DYNAMIC else a for a in args)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no stubs
    dispatch_table = ChainMap(
        {types.CodeType: _code_keeping_filename}, cloudpickle.Pickler.dispatch_table
    )


def dumps(obj: Any) -> bytes:
    """``cloudpickle.dumps(obj)``, code objects keeping their file names (where this
    cloudpickle names them ``<dynamic-code>``; else exactly ``cloudpickle.dumps``)."""
    if _code_reduce is None:
        data: bytes = cloudpickle.dumps(obj)
        return data
    with io.BytesIO() as f:
        _Pickler(f).dump(obj)
        return f.getvalue()
