"""`python -m gpufeed ...`: the command line, as the `gpufeed` script runs it."""

from gpufeed.cli import main

main()
