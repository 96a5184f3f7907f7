"""Errors the engine reports to people, each a single readable line."""


class SeqMoEError(Exception):
    """A condition the user can fix; the CLI prints it as one line and exits with status 2."""


class ModelRefused(SeqMoEError):
    """The model cannot be opened or is not supported by the engine."""


class BudgetTooSmall(SeqMoEError):
    """The cache budget leaves fewer expert slots than one layer needs."""


class ModelCodeFailed(SeqMoEError):
    """The model's own code in transformers failed while running: its type does not run with the
    installed transformers, whatever the cache does."""
