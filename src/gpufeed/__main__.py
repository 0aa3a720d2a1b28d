"""`python -m gpufeed ...`: the command line, as the `gpufeed` script runs it."""

from gpufeed.cli import main

if __name__ == "__main__":
    main()
