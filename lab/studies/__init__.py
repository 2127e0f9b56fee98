"""Study-specific parameters and helpers that the notebooks call; one module per notebook."""
