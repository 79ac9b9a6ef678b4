"""`python -m servewatch.cli`: the command line, as the `servewatch` script runs it."""

from servewatch.cli import main

main()
