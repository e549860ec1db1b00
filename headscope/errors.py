"""Errors headscope raises for bad input; the CLI prints them as one line."""

__all__ = ["HeadscopeError"]


class HeadscopeError(Exception):
    """Bad input or an unsupported model, described in one line for the user."""
