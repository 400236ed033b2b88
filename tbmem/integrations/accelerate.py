"""tbmem in an accelerate loop: a tracker for ``Accelerator(log_with=...)`` and one call after the step.

``Accelerator(log_with=[tracker])`` with ``tracker = MemoryTracker("runs/exp")`` makes ``accelerator.log(values,
step)`` write into tbmem's run (rank 0's folder under many ranks: accelerate logs on the main process), so the
loss and memory share one run and one step axis. A tracker is only handed ``log(values, step)``, which is not
where a census belongs: ``tracker.after_step(accelerator, step)``, called after ``optimizer.step()`` and
before ``optimizer.zero_grad()``, takes it there (gradients and optimizer state counted), and does nothing
while ``accumulate`` holds the step back (``accelerator.sync_gradients`` false) or when a mixed-precision
step was skipped. Pass the step you log the loss under. Each rank writes its own ``rank<r>`` folder.

Example:
    >>> import tempfile
    >>> from tbmem.integrations.accelerate import MemoryTracker
    >>> MemoryTracker(tempfile.mkdtemp(), census_every=10).name
    'tbmem'
"""

from __future__ import annotations

import os
from typing import Any

from tbmem import MemoryWriter
from tbmem import require_extra as require
from tbmem.integrations import writer_config

tracking = require("accelerate.tracking", extra="accelerate")

__all__ = ["MemoryTracker"]

WHERE = "after optimizer.step, before zero_grad (MemoryTracker.after_step)"


class MemoryTracker(tracking.GeneralTracker):  # type: ignore[name-defined]
    """An accelerate tracker writing tbmem's run: ``accelerator.log`` values, memory records and censuses.

    Args:
        log_dir: The run's folder (under many ranks the job's: each rank writes ``rank<r>`` below it).
        **options: :class:`tbmem.MemoryWriterConfig` fields (``every``, ``census_every``, ``snapshot``,
            ``alerts``, ``sinks``, ``loss_tags``, ``module_depth`` (2 here), ...), checked here.

    Example:
        >>> from accelerate import Accelerator  # doctest: +SKIP
        >>> tracker = MemoryTracker("runs/exp", census_every=100)  # doctest: +SKIP
        >>> accelerator = Accelerator(log_with=[tracker], gradient_accumulation_steps=2)  # doctest: +SKIP
        >>> for step, batch in enumerate(loader):  # doctest: +SKIP
        ...     with accelerator.accumulate(model):
        ...         loss = model(batch).loss
        ...         accelerator.backward(loss)
        ...         optimizer.step()
        ...         tracker.after_step(accelerator, step)   # the census: gradients and optimizer state
        ...         optimizer.zero_grad()
        ...     accelerator.log({"loss": loss.item()}, step=step)
    """

    name = "tbmem"
    requires_logging_directory = False
    main_process_only = False  # every rank writes its own folder (accelerator.log still calls rank 0 only)

    def __init__(self, log_dir: str | os.PathLike[str], **options: Any) -> None:
        super().__init__()
        self.config = writer_config(options)
        self.log_dir = os.fspath(log_dir)
        self.writer: MemoryWriter | None = None
        self._watched = False

    @property
    def tracker(self) -> MemoryWriter:
        """The :class:`tbmem.MemoryWriter` (what ``accelerator.get_tracker("tbmem", unwrap=True)`` gives)."""
        return self.start()

    def start(self) -> MemoryWriter:
        """Open the run (``init_trackers`` calls this; the first ``log``/``after_step`` too, on any rank)."""
        if self.writer is None or self.writer.closed:
            self.writer, self._watched = MemoryWriter(self.log_dir, config=self.config), False
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        lines = [f"| {k} | {v} |" for k, v in values.items()]
        self.start().add_text("config", "\n".join(["| key | value |", "|---|---|", *lines]))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        writer = self.start()
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                writer.add_scalar(key, value, step)
            elif isinstance(value, str):
                writer.add_text(key, value, step)
            elif hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
                writer.add_scalar(key, float(value.item()), step)

    def after_step(self, accelerator: Any, step: int) -> bool:
        """Call after ``optimizer.step()``, before ``zero_grad()``: a record and a census when ``step`` is due,
        on the steps the optimizer stepped. Returns whether anything was written."""
        if not accelerator.sync_gradients or accelerator.optimizer_step_was_skipped:
            return False  # accumulating, or a mixed-precision step skipped: no optimizer step here
        writer = self.start()
        if not self._watched:  # what accelerator.prepare() was given: the user's model and optimizer
            self._watched = True
            for model in getattr(accelerator, "_models", ()):
                writer.watch(model)
            for opt in getattr(accelerator, "_optimizers", ()):
                writer.watch(getattr(opt, "optimizer", opt))
        return writer.log_memory(step, where=WHERE)

    def step_failed(self, step: int, exc: BaseException) -> None:
        """``exc`` leaves step ``step``: an out-of-memory error gets its snapshot and record; re-raise ``exc``."""
        self.start().step_failed(step, exc)

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
