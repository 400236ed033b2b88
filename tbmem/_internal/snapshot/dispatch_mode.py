"""The dispatch recorder's mode: every operator of the recording thread runs through it, and each
output tensor goes to its owner's ``_record`` (:class:`tbmem._internal.snapshot.recorder.DispatchRecorder`).

Example:
    >>> import torch
    >>> from tbmem._internal.snapshot.dispatch_mode import RecordingMode
    >>> class Owner:
    ...     def __init__(self): self.sizes = []
    ...     def _record(self, t, args): self.sizes.append(t.untyped_storage().nbytes())
    ...     def _fail(self, exc): raise exc
    >>> owner = Owner()
    >>> with RecordingMode(owner):
    ...     y = torch.ones(4) + 1
    >>> owner.sizes
    [16, 16]
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tbmem._internal import _torch_private as tp

__all__ = ["RecordingMode", "rewrap_numbers"]

_set_eval_frame = tp.eval_frame_setter()
_op_callable = tp.op_callable
_Tensor = torch.Tensor


class RecordingMode(TorchDispatchMode):
    """Runs every operator, then hands each output tensor to its owner's ``_record``.

    This runs for every operator of the recorded thread, so it does as little as it can: the
    operator's C++ callable is called directly (no ``OpOverload.__call__`` frame), and Dynamo is
    kept out of these frames by two calls to ``set_eval_frame`` instead of the five-call wrapper
    ``TorchDispatchMode`` puts around ``__torch_dispatch__`` (see :meth:`_should_skip_dynamo`).
    """

    def __init__(self, owner: Any) -> None:
        super().__init__()
        self._owner = owner
        self.live = True  # False once stopped: the mode passes operators through until removed

    #: recognised by :mod:`tbmem._internal.snapshot.recording_threads` without importing this module
    tbmem_recording = True

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False: TorchDispatchMode leaves __torch_dispatch__ unwrapped, and it switches Dynamo's
        # frame callback off itself. Where this torch has no Dynamo, let TorchDispatchMode decide.
        return _set_eval_frame is None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        prior = _set_eval_frame(None) if _set_eval_frame is not None else None
        try:
            op = _op_callable(func)
            if not self.live:
                return op(*args, **kwargs) if kwargs else op(*args)
            try:
                out = op(*args, **kwargs) if kwargs else op(*args)
            except RuntimeError:
                # TorchScript/traced code passes "wrapped number" tensors, which reach a Python
                # dispatch mode as plain floats/ints the op's schema rejects. Rewrap them and retry;
                # when there is nothing to rewrap, the error is the user's own and propagates.
                fixed = rewrap_numbers(func, args)
                if fixed is None:
                    raise
                out = op(*fixed, **(kwargs or {}))
            owner = self._owner
            try:
                if isinstance(out, _Tensor):
                    owner._record(out, args)
                elif isinstance(out, (tuple, list)):
                    for t in out:
                        if isinstance(t, _Tensor):
                            owner._record(t, args)
            except Exception as exc:  # noqa: BLE001 - a recorder bug must not break the user's op
                owner._fail(exc)
            return out
        finally:
            if _set_eval_frame is not None:
                _set_eval_frame(prior)


def rewrap_numbers(func: Any, args: tuple) -> tuple | None:
    """``args`` with Python numbers turned into tensors where the schema wants a Tensor, or None."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return None
    fixed, changed = list(args), False
    for i, (arg, spec) in enumerate(zip(args, schema.arguments)):
        if isinstance(arg, (bool, int, float)) and isinstance(spec.type, torch._C.TensorType):
            fixed[i] = torch.scalar_tensor(arg, dtype=torch.result_type(arg, arg))
            changed = True
    return tuple(fixed) if changed else None
