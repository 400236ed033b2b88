"""tbmem in a Lightning ``Trainer``: ``Trainer(..., callbacks=[MemoryCallback(census_every=10)])``.

Works with ``lightning`` and with ``pytorch_lightning`` (the callback is an instance of both packages'
``Callback`` where both are installed). The census is taken in ``on_train_batch_end`` of the batch whose
optimizer stepped (``trainer.global_step`` moved): after ``optimizer.step()``, and before the gradients
are zeroed (Lightning zeroes them in the next batch's closure), never mid-accumulation. Its step is the
number Lightning's loggers write that optimizer step's metrics under (``train_loss`` of optimizer step
k is logged at k - 1: ``trainer.global_step`` already counts it). With ``activations=True`` the census is
taken in ``on_before_backward`` of that batch instead, with the loss as root: the saved activations show.
Memory goes into the ``TensorBoardLogger``'s own run (``logger.log_dir``, beside its event file); without
one, or under many ranks (each rank its ``rank<r>`` folder), into ``<default_root_dir>/tbmem``, where the
callback writes the logged metrics itself at Lightning's logging steps. ``on_exception`` hands an error
(an out-of-memory one: snapshot and record) to the writer before Lightning re-raises it.

Example:
    >>> from tbmem.integrations.lightning import MemoryCallback
    >>> MemoryCallback(census_every=10).activations
    False
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Any

from tbmem import MemoryWriter
from tbmem import require_extra as require
from tbmem.integrations import writer_config

# every installed flavour's Callback: Lightning checks the callbacks it is given against its own
_BASES = tuple(require(name, extra="lightning").Callback for name in ("lightning.pytorch", "pytorch_lightning")
               if importlib.util.find_spec(name.split(".")[0]) is not None) or (
    require("lightning.pytorch", extra="lightning").Callback,)

__all__ = ["MemoryCallback"]

WHERE = "after optimizer.step, before zero_grad (Lightning on_train_batch_end)"
WHERE_ACTIVATIONS = "after forward, before backward (Lightning on_before_backward)"


class MemoryCallback(*_BASES):  # type: ignore[misc]
    """Memory readings and the tensor census of a Lightning run, on the steps its loggers use.

    Args:
        log_dir: Where memory goes; None (the default): the TensorBoardLogger's run, else
            ``<default_root_dir>/tbmem``.
        activations: Take the census between forward and backward (``on_before_backward``), with
            the loss's graph as root, so activations are counted (gradients of the step are not yet).
        follow_logging: Write the memory records at Lightning's logging steps (``log_every_n_steps``:
            where its loggers write ``train_loss``) and at the census steps, instead of every ``every``.
        **options: :class:`tbmem.MemoryWriterConfig` fields (``every``, ``census_every``, ``snapshot``,
            ``alerts``, ``sinks``, ``loss_tags``, ``module_depth`` (2 here), ...), checked here.

    Example:
        >>> import lightning  # doctest: +SKIP
        >>> lightning.Trainer(max_steps=100, callbacks=[MemoryCallback(census_every=10)])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, activations: bool = False,
                 follow_logging: bool = False, **options: Any) -> None:
        super().__init__()
        self.config = writer_config(options)
        self.log_dir = log_dir
        self.activations, self.follow_logging = bool(activations), bool(follow_logging)
        self.writer: MemoryWriter | None = None
        self.own_logs = False
        self._before = 0  # trainer.global_step when the batch began
        self._batch = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._close()
        log_dir, shared = self._where(trainer)
        config = dataclasses.replace(self.config, every=1) if self.follow_logging else self.config
        self.writer = MemoryWriter(log_dir, config=config)  # follow_logging: _logged picks the steps
        self.own_logs = not shared
        self.writer.watch(pl_module, *trainer.optimizers)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._before, self._batch = trainer.global_step, batch_idx

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        if self.activations and self.writer is not None and self._steps(trainer) and (
                not self.follow_logging or self._logged(trainer)):
            self.writer.log_memory(_step(trainer), roots=(loss,), where=WHERE_ACTIVATIONS)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.writer is None or trainer.global_step == self._before:
            return  # accumulating: the optimizer did not step
        step = _step(trainer)
        if not self.activations and (not self.follow_logging or self._logged(trainer)):  # one test at the defaults
            self.writer.log_memory(step, where=WHERE)
        n = trainer.log_every_n_steps
        if self.own_logs and n and (step + 1) % n == 0:  # Lightning's own logging condition
            for key, value in trainer.callback_metrics.items():
                if getattr(value, "numel", lambda: 0)() == 1:
                    self.writer.add_scalar(key, float(value), step)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.writer is not None:
            self.writer.step_failed(_step(trainer), exception)  # Lightning re-raises it unchanged

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._close()

    def _logged(self, trainer: Any) -> bool:
        """follow_logging: whether this optimizer step is one Lightning logs at, or a census step."""
        step, n, c = _step(trainer), trainer.log_every_n_steps, self.config.census_every
        return bool(n and (step + 1) % n == 0) or bool(c and step % c == 0)

    def _steps(self, trainer: Any) -> bool:
        """Whether the optimizer steps at the end of this batch (its last micro-batch of accumulation)."""
        n, last = trainer.accumulate_grad_batches, trainer.num_training_batches
        return (self._batch + 1) % n == 0 or self._batch + 1 == last

    def _where(self, trainer: Any) -> tuple[str, bool]:
        if self.log_dir is not None:
            return os.fspath(self.log_dir), False
        if trainer.world_size == 1:
            for logger in trainer.loggers:
                if type(logger).__name__ == "TensorBoardLogger":
                    return os.fspath(logger.log_dir), True
        return os.path.join(trainer.default_root_dir, "tbmem"), False

    def _close(self) -> None:
        if self.writer is not None:
            self.writer.close()  # our own SummaryWriter: the logger's is the logger's to close
            self.writer = None


def _step(trainer: Any) -> int:
    """The step Lightning's loggers write this batch's metrics under (its epoch loop's count of batches that
    stepped; ``global_step - 1`` after the step where that count is not there)."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    stepped = getattr(loop, "_batches_that_stepped", None)
    return int(stepped) if isinstance(stepped, int) else max(0, trainer.global_step - 1)
