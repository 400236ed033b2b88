"""tbmem in a Hugging Face ``Trainer``: ``Trainer(..., callbacks=[MemoryCallback(census_every=10)])``.

The census is taken in ``on_optimizer_step``: after ``optimizer.step()`` and before ``model.zero_grad()``,
so gradients and optimizer state are counted, and only on the steps where the optimizer stepped (never
inside gradient accumulation). ``on_step_end``, the hook users reach for, runs after ``zero_grad``: a census
there counts 0 B of gradients. The step is ``state.global_step + 1``, the number the Trainer logs that
optimizer step under (it counts the step after the hook). With ``report_to="tensorboard"`` memory goes
into the Trainer's own TensorBoard run (beside its event file; its writer is the Trainer's to close);
without it, or under many ranks (each rank its ``rank<r>`` folder), into ``<output_dir>/tbmem``, where the
callback writes the Trainer's logs (``train/loss``, ...) itself. An out-of-memory error in the model's
forward gets its snapshot and record before it reaches the user, through a forward hook on the model
removed at the end of training; :class:`MemoryTrainerMixin` covers backward too (docs/integrations.md).

Example:
    >>> import tempfile
    >>> from tbmem.integrations.transformers import MemoryCallback
    >>> MemoryCallback(census_every=10, every=5).options["census_every"]
    10
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from typing import Any

from tbmem import MemoryWriter, MemoryWriterConfig
from tbmem import require_extra as require

transformers = require("transformers", extra="transformers")

__all__ = ["MemoryCallback", "MemoryTrainerMixin"]

WHERE = "after optimizer.step, before zero_grad (Trainer on_optimizer_step)"


class MemoryCallback(transformers.TrainerCallback):  # type: ignore[name-defined]
    """Memory readings and the tensor census of a ``transformers.Trainer`` run, on the Trainer's steps.

    Args:
        log_dir: Where memory goes; None (the default): the Trainer's TensorBoard run, else
            ``<output_dir>/tbmem``.
        follow_logging: Write the memory records at the Trainer's logging steps (``every`` becomes
            ``logging_steps``).
        **options: :class:`tbmem.MemoryWriterConfig` fields (``every``, ``census_every``, ``snapshot``,
            ``alerts``, ``sinks``, ...), checked here.

    Example:
        >>> from transformers import Trainer  # doctest: +SKIP
        >>> Trainer(model, args, train_dataset=data, callbacks=[MemoryCallback(census_every=10)])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, follow_logging: bool = False,
                 **options: Any) -> None:
        self.config = MemoryWriterConfig(**options)  # a wrong option fails here, not at train()
        self.options = options
        self.log_dir = log_dir
        self.follow_logging = bool(follow_logging)
        self.writer: MemoryWriter | None = None
        self.own_logs = False  # the Trainer's logs go into our run: its TensorBoard run is not ours
        self._hook: Any = None
        self._state: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self._close()
        self._state = state
        config = self.config
        if self.follow_logging and args.logging_steps:
            steps = args.logging_steps
            every = int(steps) if steps >= 1 else max(1, math.ceil(state.max_steps * steps))
            config = dataclasses.replace(config, every=every)
        log_dir, shared = self._where(args)
        self.writer = MemoryWriter(log_dir, config=config)
        self.own_logs = not shared
        if model is not None:
            self.writer.watch(model)
            self._hook = model.register_forward_hook(self._after_forward, always_call=True)
        if optimizer is not None:  # accelerate's AcceleratedOptimizer holds the torch one
            self.writer.watch(getattr(optimizer, "optimizer", optimizer))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.writer is not None:
            self.writer.log_memory(state.global_step + 1, where=WHERE)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self.writer is None or not self.own_logs or not logs:
            return
        for key, value in logs.items():  # as the Trainer's TensorBoardCallback names them (rewrite_logs)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                tag = (f"eval/{key[5:]}" if key.startswith("eval_") else f"test/{key[5:]}"
                       if key.startswith("test_") else f"train/{key}")
                self.writer.add_scalar(tag, value, state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close()

    def step_failed(self, step: int, exc: BaseException) -> None:
        """``exc`` leaves the Trainer's step ``step``: an out-of-memory error gets its snapshot and record."""
        if self.writer is not None:
            self.writer.step_failed(step, exc)

    def _after_forward(self, module: Any, args: Any, result: Any) -> None:
        # always_call: also run while an exception leaves forward, inside torch's except block
        if result is None and self.writer is not None:
            exc = sys.exc_info()[1]
            if exc is not None and self._state is not None:
                self.writer.step_failed(self._state.global_step + 1, exc)

    def _where(self, args: Any) -> tuple[str, bool]:
        """The log_dir, and whether it is the Trainer's TensorBoard run (its losses are there already)."""
        if self.log_dir is not None:
            return os.fspath(self.log_dir), False
        many = getattr(args, "world_size", 1) > 1
        tb = _tensorboard_dir(self)
        if tb is not None and not many:
            return tb, True
        # every rank the same job folder: the Trainer's TensorBoard folder exists on rank 0 only
        return os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(args.output_dir, "tbmem"), False

    def _close(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.writer is not None:
            self.writer.close()  # our own SummaryWriter: the Trainer's is the Trainer's to close
            self.writer = None


class MemoryTrainerMixin:
    """``class MyTrainer(MemoryTrainerMixin, Trainer)``: an error anywhere in a training step (forward,
    backward) reaches the :class:`MemoryCallback`, so an out-of-memory error in backward gets its snapshot
    and record before it goes on unchanged (the callback alone sees errors in forward only).

    Example:
        >>> class MyTrainer(MemoryTrainerMixin, transformers.Trainer):  # doctest: +SKIP
        ...     pass
    """

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            for cb in self.callback_handler.callbacks:  # type: ignore[attr-defined]
                if isinstance(cb, MemoryCallback):
                    cb.step_failed(self.state.global_step + 1, exc)  # type: ignore[attr-defined]
            raise


def _tensorboard_dir(me: Any) -> str | None:
    """The logging_dir of the Trainer's TensorBoardCallback, read from the CallbackHandler calling us
    (a callback is handed no reference to the Trainer or its other callbacks)."""
    frame: Any = sys._getframe()
    for _ in range(6):
        if frame is None:
            return None
        callbacks = getattr(frame.f_locals.get("self"), "callbacks", None)
        if isinstance(callbacks, list) and any(c is me for c in callbacks):
            for cb in callbacks:
                if type(cb).__name__ == "TensorBoardCallback" and getattr(cb, "tb_writer", None) is not None:
                    return os.fspath(cb.logging_dir)
            return None
        frame = frame.f_back
    return None
