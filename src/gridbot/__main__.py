"""`python -m gridbot` is the `gridbot` command."""

from gridbot.cli.main import main

main()
