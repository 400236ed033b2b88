"""The implementation of the public facade :mod:`tbmem.analysis`."""
