"""What each CLI command does, in one place: load a run, analyze it, hand the result to a
presenter, then write the file or print it (show, ls, report with its `--watch` loop, trace,
export). Presenters in `present` only render what they are given; this package is the only one
that strings load → analyze → render → write together."""
