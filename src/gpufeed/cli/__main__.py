"""`python -m gpufeed.cli ...`: the command line, as the `gpufeed` script runs it (the tests' way)."""

from gpufeed.cli import main

if __name__ == "__main__":
    main()
