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

from typing import Any

from tbmem import MemoryWriterConfig

__all__ = ["FRAMEWORKS", "MODULE_DEPTH", "writer_config"]

#: submodule -> the extra that installs its framework
FRAMEWORKS = {"transformers": "transformers", "lightning": "lightning", "accelerate": "accelerate"}

#: The adapters' ``module_depth`` (the writer's is 1): what a framework is handed is a wrapper around the network
#: (a ``LightningModule``'s ``self.net``, a ``GPT2LMHeadModel``'s ``transformer`` beside its tied ``lm_head``), so
#: one level names one bar; two name its parts (``model.transformer.h``, ``model.transformer.wte``).
MODULE_DEPTH = 2


def writer_config(options: dict[str, Any]) -> MemoryWriterConfig:
    """The :class:`tbmem.MemoryWriterConfig` of an adapter's ``**options`` (checked: a wrong one fails when the
    callback is made, not at ``fit()``), with the adapters' :data:`MODULE_DEPTH` unless ``module_depth`` is given.

    Example:
        >>> writer_config({"census_every": 10}).module_depth, writer_config({"module_depth": 1}).module_depth
        (2, 1)
    """
    return MemoryWriterConfig(**{"module_depth": MODULE_DEPTH, **options})
