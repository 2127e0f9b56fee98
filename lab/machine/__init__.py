"""What the machine can do and how long things take on it: datasheets and probes (`hardware`), the roofline model
(`roofline`), and timing (`timing`)."""
