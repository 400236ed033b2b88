"""The implementation of the public facade :mod:`tbmem.analysis`."""

__all__: list[str] = []
