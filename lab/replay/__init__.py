"""Replay: drop part of the KV cache and recompute it, and measure when that pays (notebook 04).

- `cost`: recompute FLOPs, bytes to move, the crossover link bandwidth, a break-even table per model,
  accelerator and link;
- `controller`: the seed article's controller, driving the engine's rewind-and-recompute;
- `measure`: on this machine, loading a window's KV from each tier against recomputing it on the engine;
- `engine_cost`, `microbench`: what the engine's recompute step costs on the machine it runs on, term by term
  (fixed, forward, gather, attention), each term's ceiling from its own microbenchmark in the same run.
"""

from .controller import ReplayConfig, ReplayController
from .cost import LINKS, WindowCost, break_even_table, window_cost

__all__ = ["LINKS", "ReplayConfig", "ReplayController", "WindowCost", "break_even_table", "window_cost"]
