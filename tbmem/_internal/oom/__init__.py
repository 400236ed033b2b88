"""Out-of-memory errors explained: what was asked for, where the device's bytes were, and what to change.

:mod:`tbmem._internal.oom.explain` computes the explanation from an allocator snapshot (a file's ``oom``
event, or the live allocator's segments at the error, :mod:`tbmem._internal.oom.runtime`);
:mod:`tbmem._internal.oom.text` prints it as one block; :mod:`tbmem._internal.oom.settings` reads the allocator's
settings. ``explain`` and ``text`` import no torch.
"""

from __future__ import annotations

__all__: list[str] = []
