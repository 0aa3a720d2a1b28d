"""SHOW: terminal summary, HTML report, Perfetto/Chrome trace."""
