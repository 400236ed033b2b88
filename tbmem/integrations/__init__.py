"""tbmem inside the frameworks people train with: one callback, the census at the framework's own step.

* :mod:`tbmem.integrations.transformers`: ``MemoryCallback``, a Hugging Face ``TrainerCallback``;
* :mod:`tbmem.integrations.lightning`: ``MemoryCallback``, a Lightning ``Callback`` (``lightning`` or
  ``pytorch_lightning``);
* :mod:`tbmem.integrations.accelerate`: ``MemoryTracker``, an accelerate ``GeneralTracker``, and its
  ``after_step`` call.

Each submodule imports its framework when it is imported (the extras ``tbmem[transformers]``,
``tbmem[lightning]``, ``tbmem[accelerate]``); this package imports none. Each uses only tbmem's public
API. See docs/integrations.md.

Example:
    >>> import tbmem.integrations
    >>> sorted(tbmem.integrations.FRAMEWORKS)
    ['accelerate', 'lightning', 'transformers']
"""

from __future__ import annotations

__all__ = ["FRAMEWORKS"]

#: submodule -> the extra that installs its framework
FRAMEWORKS = {"transformers": "transformers", "lightning": "lightning", "accelerate": "accelerate"}
