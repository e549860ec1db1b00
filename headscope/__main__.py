"""`python -m headscope` runs the command line."""
from .cli import main

main()
