"""Ignore one known-wrong warning between two hooks, without changing the process's warning filters for good.

Lightning warns from inside its loops, so a ``with warnings.catch_warnings()`` block cannot wrap the call
that warns. :class:`IgnoredWarning` opens a ``catch_warnings`` scope in one hook and closes it in a later one;
closing restores the filters as they were when it opened, so nothing outlives the run.
"""

from __future__ import annotations

import warnings


class IgnoredWarning:
    """One ignored warning message (a regular expression matched at the start), scoped by :meth:`open`/:meth:`close`.

    Args:
        message: regular expression for the start of the warning text.
    """

    def __init__(self, message: str) -> None:
        self.message = message
        self._scope: warnings.catch_warnings | None = None

    @property
    def is_open(self) -> bool:
        return self._scope is not None

    def open(self) -> None:
        """Start ignoring the message (a no-op if already open)."""
        if self._scope is not None:
            return
        self._scope = warnings.catch_warnings()
        self._scope.__enter__()
        warnings.filterwarnings("ignore", message=self.message)

    def close(self) -> None:
        """Put the warning filters back as they were at :meth:`open` (a no-op if not open)."""
        if self._scope is None:
            return
        scope, self._scope = self._scope, None
        scope.__exit__(None, None, None)
