"""Statistics: intervals over independent units (`intervals`: bootstrap, Wilson, percentile, run-level spreads)."""
