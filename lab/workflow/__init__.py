"""The run workflow: run a notebook or script at a preset (`notebook`, `script`, `kernel_client`), record what it
measured with its provenance (`run`, `provenance`, `atomic`), find, compare and judge runs against the code
(`index`, `compare`, `staleness`), and sweep or steer a notebook's parameters (`sweep`, `widgets`)."""
