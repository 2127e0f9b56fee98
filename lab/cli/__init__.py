"""The `lab` console command: `lab generate`, `lab serve`, `lab bench engine|serve|quant`, the studies' CLIs.

Each module of this package holds a group of subcommands, each with its parser (`add_<command>`) and its
handler; `build_parser` assembles them in the order `lab --help` lists them.
"""

from __future__ import annotations

import argparse
import sys

from . import accounts, bench, claims, inference, models, quant, runs, spec, sweep

# In `lab --help` order.
SUBCOMMANDS = (inference.add_generate, bench.add_bench, runs.add_run, sweep.add_sweep, accounts.add_memory,
               quant.add_quant, quant.add_eval, accounts.add_replay, spec.add_spec, inference.add_serve,
               runs.add_results, runs.add_runs, runs.add_docs, runs.add_report, claims.add_claims,
               models.add_checkpoint)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lab", description="Inference Lab: a reference engine and studies.")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"lab: error: {e}", file=sys.stderr)
        return 2
