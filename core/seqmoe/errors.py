"""Errors the engine reports to people, each a single readable line."""


class SeqMoEError(Exception):
    """A condition the user can fix; the CLI prints it as one line and exits with status 2."""


class ModelRefused(SeqMoEError):
    """The model cannot be opened or is not supported by the engine."""


class BudgetTooSmall(SeqMoEError):
    """The cache budget leaves fewer expert slots than one layer needs."""
