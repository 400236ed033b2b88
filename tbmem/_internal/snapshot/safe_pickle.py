"""Reading pickled memory snapshots without ever running code from the file.

PyTorch's ``_dump_snapshot`` (and Composer's, torchtitan's) pickles are plain
data: dicts, lists, strings, numbers. The only way a pickle runs code is by
naming a global (``GLOBAL``/``STACK_GLOBAL``, then ``REDUCE``/``BUILD``/``NEWOBJ``
on it), and every such name goes through ``Unpickler.find_class``. This
unpickler refuses every name, so a file that tries gets an
:class:`UnsafePickleError` before anything it names is imported. Subclassing
``pickle.Unpickler`` keeps the C implementation (the override is looked up once),
so a 1 GB snapshot loads at C speed.

Example:
    >>> import io, pickle
    >>> from tbmem._internal.snapshot.safe_pickle import loads_plain, UnsafePickleError
    >>> loads_plain(pickle.dumps({"segments": [], "device_traces": [[]]}))
    {'segments': [], 'device_traces': [[]]}
    >>> class Evil:
    ...     def __reduce__(self):
    ...         return (print, ("pwned",))
    >>> try:
    ...     loads_plain(pickle.dumps(Evil()))
    ... except UnsafePickleError as exc:
    ...     print(exc)
    refusing to load builtins.print: snapshot pickles are plain data and may name no Python object
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any, BinaryIO

__all__ = ["UnsafePickleError", "load_plain", "loads_plain", "looks_like_pickle"]


class UnsafePickleError(pickle.UnpicklingError):
    """The pickle names a Python object (a class or function), which plain data never does."""


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:  # noqa: D401 - pickle's hook
        raise UnsafePickleError(
            f"refusing to load {module}.{name}: snapshot pickles are plain data and may name no Python object"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafePickleError("refusing a persistent id: snapshot pickles are plain data")


def load_plain(source: str | os.PathLike[str] | BinaryIO) -> Any:
    """Unpickle plain data (dicts, lists, tuples, strings, bytes, numbers, booleans, None).

    Args:
        source: A path or an open binary file.

    Raises:
        UnsafePickleError: the file names a Python object (nothing from it has run).
        pickle.UnpicklingError, EOFError: the file is not a complete pickle.
    """
    if hasattr(source, "read"):
        return _PlainDataUnpickler(source).load()  # type: ignore[arg-type]
    with open(os.fspath(source), "rb") as fh:
        return _PlainDataUnpickler(fh).load()


def loads_plain(data: bytes) -> Any:
    """:func:`load_plain` from bytes."""
    return _PlainDataUnpickler(io.BytesIO(data)).load()


def looks_like_pickle(head: bytes) -> bool:
    """Whether a file's first bytes are a pickle's (protocol 2+ starts with ``\\x80`` and the protocol)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5
