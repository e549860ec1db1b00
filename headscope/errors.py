"""Errors headscope raises for bad input; the CLI prints them as one line."""

__all__ = ["HeadscopeError", "CannotScore"]


class HeadscopeError(Exception):
    """Bad input or an unsupported model, described in one line for the user.

    Args:
        message: what was wrong and, where it helps, what to do instead (one line, no traceback
            needed to act on it).
    """


class CannotScore(HeadscopeError):
    """A detector cannot score this model on its probe (e.g. too few dependency arcs fit a short
    context): `analyze` leaves it out, and says so, when it was not asked for by name."""
