"""Errors that stage entry points turn into clean exits.

``BadInput`` (exit 2): the user gave something invalid — params, a missing or corrupt
file, a forbidden split. ``RunFailed`` (exit 1): a run went wrong (NaN loss, ...), with a
last good checkpoint saved.
"""


class BadInput(Exception):
    exit_code = 2


class SplitAccessError(BadInput):
    """A stage without the evaluation role asked for the test split."""


class RunFailed(Exception):
    exit_code = 1
