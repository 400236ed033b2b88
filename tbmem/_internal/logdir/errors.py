"""Why a logdir cannot be read: the errors of its readers, in words a user can act on.

``tbmem report`` prints them (exit status 2) and the analysis API raises them; they are
the reader half's (:mod:`tbmem._internal.logdir`), named as the analysis API has always named them.

Example:
    >>> from tbmem._internal.logdir.errors import AnalysisError, NoEventFilesError
    >>> issubclass(NoEventFilesError, AnalysisError)
    True
"""

from __future__ import annotations

__all__ = ["AnalysisError", "LogdirNotFoundError", "NoEventFilesError", "NoTbmemTagsError", "CorruptEventFileError"]


class AnalysisError(Exception):
    """A logdir cannot be read or analysed; the message says why in words a user can act on."""


class LogdirNotFoundError(AnalysisError):
    """The logdir does not exist or is not a directory."""


class NoEventFilesError(AnalysisError):
    """The logdir holds no TensorBoard event files."""


class NoTbmemTagsError(AnalysisError):
    """The event files hold none of the tags tbmem writes."""


class CorruptEventFileError(AnalysisError):
    """An event file ends in a truncated record or fails a checksum."""
