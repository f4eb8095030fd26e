import warnings

from lit_prunedpo.warning_scope import IgnoredWarning


def _shown(message: str) -> bool:
    with warnings.catch_warnings(record=True) as caught:  # keeps the current filters, records what passes
        warnings.warn(message, UserWarning)
    return any(message in str(w.message) for w in caught)


def test_ignored_only_while_open_then_filters_restored():
    before = list(warnings.filters)
    scope = IgnoredWarning(r"resuming from \d+")
    scope.open()
    scope.open()  # a no-op: one scope
    assert scope.is_open and not _shown("resuming from 3")
    assert _shown("something else")
    scope.close()
    scope.close()
    assert not scope.is_open and warnings.filters == before
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert _shown("resuming from 4")
