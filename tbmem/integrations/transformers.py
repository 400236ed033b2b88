"""tbmem in a Hugging Face ``Trainer``: ``Trainer(..., callbacks=[MemoryCallback(census_every=10)])``.

The census is taken in ``on_optimizer_step`` (after ``optimizer.step()``, before ``model.zero_grad()``: not
``on_step_end``, where gradients are 0 B), only where the optimizer stepped, at ``state.global_step + 1``: the
step the Trainer logs that optimizer step under. Memory goes into the Trainer's TensorBoard run (its writer is
the Trainer's to close); without one, or under many ranks, into ``<output_dir>/tbmem`` with the Trainer's logs.
An out-of-memory error in forward gets its snapshot and record (a forward hook, removed at the end);
:class:`MemoryTrainerMixin` covers backward and the optimizer step too. See docs/integrations.md.

Example:
    >>> from tbmem.integrations.transformers import MemoryCallback
    >>> MemoryCallback(census_every=10, every=5).options["census_every"]
    10
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import weakref
from typing import Any

from tbmem import MemoryWriter
from tbmem import require_extra as require
from tbmem.integrations import writer_config

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
            ``alerts``, ``sinks``, ``loss_tags``, ``module_depth`` (2 here), ...), checked here.

    Example:
        >>> from transformers import Trainer  # doctest: +SKIP
        >>> Trainer(model, args, train_dataset=data, callbacks=[MemoryCallback(census_every=10)])  # doctest: +SKIP
    """

    def __init__(self, log_dir: str | os.PathLike[str] | None = None, *, follow_logging: bool = False,
                 **options: Any) -> None:
        self.config = writer_config(options)
        self.options = options
        self.log_dir = log_dir
        self.follow_logging = bool(follow_logging)
        self.writer: MemoryWriter | None = None
        self.own_logs = False  # we write the Trainer's logs: its TensorBoard run is not ours
        self._hook: Any = None
        self._state: Any = None
        self._failed: Any = None  # a weak reference to what was handed over (forward hook, then the mixin)

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
        """``exc`` leaves the Trainer's step ``step``: an out-of-memory error gets its snapshot and record, once."""
        if self.writer is not None and (self._failed is None or self._failed() is not exc):
            try:  # weakly: a traceback kept here would keep the failed step's tensors alive
                self._failed = weakref.ref(exc)
            except TypeError:  # a built-in exception (not an OOM): flushed twice at worst
                self._failed = None
            self.writer.step_failed(step, exc)

    def _after_forward(self, module: Any, args: Any, result: Any) -> None:
        # always_call: also run while an exception leaves forward, inside torch's except block
        if result is None and self.writer is not None:
            exc = sys.exc_info()[1]
            if exc is not None and self._state is not None:
                self.step_failed(self._state.global_step + 1, exc)

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
    """``class MyTrainer(MemoryTrainerMixin, Trainer)``: an error in forward or backward (``training_step``) or in
    the optimizer step (called inline by the Trainer: handed over as it leaves ``train``) reaches the
    :class:`MemoryCallback` once, so an out-of-memory error gets its snapshot and record, then goes on unchanged.

    Example:
        >>> class MyTrainer(MemoryTrainerMixin, transformers.Trainer):  # doctest: +SKIP
        ...     pass
    """

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().training_step(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            self._memory_failed(exc, end=False)
            raise

    def train(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().train(*args, **kwargs)  # type: ignore[misc]
        except BaseException as exc:
            self._memory_failed(exc, end=True)  # on_train_end will not come: the hook off, the writer closed
            raise

    def _memory_failed(self, exc: BaseException, *, end: bool) -> None:
        for cb in self.callback_handler.callbacks:  # type: ignore[attr-defined]
            if isinstance(cb, MemoryCallback):
                cb.step_failed(self.state.global_step + 1, exc)  # type: ignore[attr-defined]
                if end:
                    cb.on_train_end(self.args, self.state, self.control)  # type: ignore[attr-defined]


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
