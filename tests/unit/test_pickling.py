"""A training function defined in a script keeps its file name in the worker
(``torchjob.launch.pickling``): the worker's traceback names the user's file and line."""

from __future__ import annotations

import traceback
import types

import cloudpickle

from torchjob.launch import pickling


def _from_a_script() -> types.FunctionType:
    """A function as a script's ``__main__`` defines it: cloudpickle pickles it by value."""
    source = "def train(config):\n    return config['lr'].bit_length()\n"
    namespace: dict[str, object] = {"__name__": "__main__"}
    exec(compile(source, "/home/user/my_train.py", "exec"), namespace)
    fn = namespace["train"]
    assert isinstance(fn, types.FunctionType)
    return fn


def _raised(fn: types.FunctionType) -> str:
    try:
        fn({"lr": 0.1})
    except AttributeError as exc:
        return "".join(traceback.format_exception(exc))
    raise AssertionError("did not raise")


def test_a_script_s_function_keeps_its_file_name_across_the_pickle() -> None:
    fn = _from_a_script()
    assert "<dynamic-code>" in _raised(cloudpickle.loads(cloudpickle.dumps(fn))), "the default"
    again = cloudpickle.loads(pickling.dumps(fn))
    assert 'File "/home/user/my_train.py", line 2, in train' in _raised(again)
    assert again({"lr": 3}) == 2, "the function itself is unchanged"


def test_everything_else_pickles_as_cloudpickle_does() -> None:
    payload = (len, (1, 2), {"k": [1.5, None]})
    assert cloudpickle.loads(pickling.dumps(payload)) == payload
    assert pickling.dumps(payload) == cloudpickle.dumps(payload)
