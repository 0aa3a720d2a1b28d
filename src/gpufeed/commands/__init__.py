"""What each CLI command does, in one place: load a run, analyze it, hand the result to a presenter,
write the file (report: HTML + JSON and the `--watch` loop; trace). Presenters in `present` only
render what they are given; this package is the only one that strings load → analyze → render → write."""
