"""Errors and warnings headscope raises for bad input; the CLI prints each as one line.

- `HeadscopeError`: bad input or an unsupported model (the CLI exits 1).
- `UsageError`: a bad argument or option value, such as a number out of range or an unknown
  name (a `HeadscopeError`; the CLI exits 2, as for a typo'd option).
- `CannotScore`: a detector cannot score this model on its probe.
- `HeadscopeWarning`: something headscope accepted but the user should know (a policy file's
  values clipped as its format's own reader clips them, a folder read without its manifest);
  the CLI prints it as one `warning:` line.
"""

__all__ = ["HeadscopeError", "UsageError", "CannotScore", "HeadscopeWarning"]


class HeadscopeError(Exception):
    """Bad input or an unsupported model, described in one line for the user.

    Args:
        message: what was wrong and, where it helps, what to do instead (one line, no traceback
            needed to act on it).
    """


class UsageError(HeadscopeError):
    """A bad argument or option value (out of range, an unknown name, a malformed list): the
    caller's mistake, not a damaged file; the command line exits with status 2.

    Args:
        message: which argument, what it was and what it takes (one line).
    """


class CannotScore(HeadscopeError):
    """A detector cannot score this model on its probe (e.g. too few dependency arcs fit a short
    context): `analyze` leaves it out, and says so, when it was not asked for by name."""


class HeadscopeWarning(UserWarning):
    """Something headscope accepted and says in one line (`warnings.warn(..., HeadscopeWarning)`).

    Args:
        message: what was accepted and what it means (a policy file's values clipped as its
            format's own reader clips them; a folder read without its manifest).
    """
