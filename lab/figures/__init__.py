"""The plot standard: the lab's figure style (`style`: palette, legends off the data, intervals drawn) and the
checks every saved figure passes (`check`: units on axes, labelled claim lines, no hidden series, ...)."""
