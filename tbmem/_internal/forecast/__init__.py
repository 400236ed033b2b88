"""The implementation of the public facade :mod:`tbmem.forecast`."""

__all__: list[str] = []
