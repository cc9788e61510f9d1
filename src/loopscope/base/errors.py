"""How loopscope fails: the kinds of error a user can fix.

Every error a user can fix (a bad param, a missing or corrupt file, a diverged run) is
a LoopscopeError whose message names the key or file and what to do; the stage runner
prints it as one `error:` line instead of a traceback (loopscope.stage). The messages
are written where each error is raised; this module holds the kinds alone, so that
training, which raises some of them, does not depend on any message text.
"""

from __future__ import annotations


class LoopscopeError(RuntimeError):
    """An error whose message already says what went wrong and what to do."""


class ParamsError(LoopscopeError, ValueError):
    """A bad value in params.yaml (or a cell override), with its key path."""


class DataError(LoopscopeError):
    """Missing, empty or corrupt data files; the message names the file."""


class CorpusError(LoopscopeError):
    """The corpus could not be fetched or verified; the message says what to do."""


class CheckpointError(LoopscopeError):
    """A checkpoint is missing or unreadable; the message names the file."""


class DivergenceError(LoopscopeError):
    """The loss became NaN or infinite; the message names the cell, step and lr."""


class ResourceError(LoopscopeError):
    """Not enough memory or disk for a run, found before it starts; the message gives
    the need, what there is, and the keys to lower."""


class CollapseError(LoopscopeError):
    """Past half of the run the final loop's CE is still no better than the training
    split's unigram entropy while the loss stays finite (a collapse: nothing learned that tells
    the tokens apart); the message names the cell, steps, lr and the cosine seen."""
