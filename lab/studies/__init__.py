"""The studies, one package per notebook (measurement, claims and plots as its modules), and the two packages that
read every study's runs: `findings` (each study's one sentence and key figure) and `evidence` (the figures the
ledger rebuilds from a run's files)."""
