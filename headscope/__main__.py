"""The command line's entry point (`headscope` and `python -m headscope`).

`main()` installs the interrupt handler (`headscope.atomic.exit_on_interrupt`) before the
command line imports typer, pandas or torch: Ctrl-C at any moment exits with status 130 and one
line on stderr saying what was written, never a traceback; temporary folders are removed.
"""
from .atomic import exit_on_interrupt


def main() -> None:
    exit_on_interrupt()
    from .cli import main as run

    run()


if __name__ == "__main__":
    main()
