"""A compiled CRC32C for tbmem's own event files.

TensorBoard (without TensorFlow) checksums every event record with a pure-Python
CRC32C that runs on its writer thread and holds the GIL: about 0.2 us per byte,
which dominates the cost of writing scalars. A :class:`tbmem.MemoryWriter` frames the
records of its own event files with :func:`masked_crc32c` instead, the ``google-crc32c``
C implementation (:func:`tbmem._internal._safe_io.install`, ``fast_crc=True``); TensorBoard's
module-level CRC function, which every other ``SummaryWriter`` of the process uses, is
never replaced. The checksums are bit-identical (tests compare them on random data), so
event files do not change.

Example:
    >>> from tbmem._internal._fastcrc import masked_crc32c
    >>> masked_crc32c(b"tbmem") == __import__(
    ...     "tensorboard.compat.tensorflow_stub.pywrap_tensorflow", fromlist=["x"]).masked_crc32c(b"tbmem")
    True
"""

from __future__ import annotations

from typing import Any

__all__ = ["masked_crc32c", "install_reader", "available"]

_gcrc: Any
try:
    import google_crc32c as _gcrc

    _C_IMPL = _gcrc.implementation == "c"
except ImportError:  # optional: without it TensorBoard's own CRC is used
    _gcrc = None
    _C_IMPL = False


def available() -> bool:
    """Whether the compiled CRC32C is importable."""
    return _C_IMPL


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C of ``data`` (same value as TensorBoard's pure-Python one)."""
    if _gcrc is None:
        from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as slow

        return slow(data)
    x = _gcrc.value(bytes(data))
    return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def install_reader() -> bool:
    """Make TensorBoard's record reader use the compiled CRC; False when unavailable.

    Reading checks every record's CRC in pure Python too (about 1 s per MB without this). Only
    the reader's name is replaced: TensorBoard's record writer bound its own CRC function when
    it was imported, and is imported here first, so no SummaryWriter's records change.
    """
    if not _C_IMPL:
        return False
    from tbmem._internal._tensorboard_private import use_reader_crc

    use_reader_crc(masked_crc32c)
    return True
