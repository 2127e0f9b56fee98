"""The dashboard of one load run (`lab bench serve --plot`, notebook 06): what a load did over its time, drawn from
two tables a run can keep (`report_tables`: one row per request, one per /metrics poll), so that a committed
run's dashboard is redrawn from its files like every other figure (`lab.studies.findings`).

Five panels on one time axis, from 0 to the load's end: TTFT and TPOT (P50 and P99 over the last 8 requests to
finish, each on its own scale), output tokens per second (1-s bins, each request's tokens spread evenly between its
first token and its end), the KV blocks in use, and the requests running and waiting (from /metrics).
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd

from lab.figures.style import PALETTE, legend_outside

WINDOW = 8  # requests in each rolling percentile


def report_tables(report) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, scrapes) of a `lab.bench.serve.LoadReport`, with the load's duration as a column of both."""
    requests = pd.DataFrame([asdict(r) for r in report.requests])
    scrapes = pd.DataFrame(report.scrapes)
    requests["load_duration_s"] = report.duration_s
    scrapes["load_duration_s"] = report.duration_s
    return requests, scrapes


def save(run, name: str, report, title: str):
    """Keep a load's tables in `run` (`name`_requests.csv, `name`_scrapes.csv) and save its dashboard drawn from
    them as `name`.png, so the committed figure can be redrawn from the run's files."""
    requests, scrapes = report_tables(report)
    run.save_table(f"{name}_requests", requests)
    run.save_table(f"{name}_scrapes", scrapes)
    return run.save_figure(name, plot_tables(requests, scrapes, title))


def plot_dashboard(report, title: str):
    """`plot_tables` of a `LoadReport`."""
    return plot_tables(*report_tables(report), title)


def _rolling(ax, done, values, name: str, scale: float, colours) -> None:
    for q, ls, colour in ((50, "-", colours[0]), (99, "--", colours[1])):
        roll = [np.nanpercentile(values[max(0, i - WINDOW + 1):i + 1], q) * scale for i in range(len(values))]
        ax.plot(done, roll, ls=ls, color=colour, label=f"{name} P{q} (last {WINDOW})")


def plot_tables(requests: pd.DataFrame, scrapes: pd.DataFrame, title: str):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    duration = float(pd.concat([requests.get("load_duration_s", pd.Series(dtype=float)),
                                scrapes.get("load_duration_s", pd.Series(dtype=float))]).max() or 0.0)
    ok = requests[requests["status"] == "ok"].sort_values("finish_time") if len(requests) else requests
    fig, axes = plt.subplots(3, 2, figsize=(11, 8), sharex=True)
    ttft, tpot, tokens, blocks, queue, spare = axes.flat
    spare.set_visible(False)
    end = max([duration, *scrapes.get("t", []), *(ok["finish_time"] if len(ok) else [])])
    if len(ok):
        done = ok["finish_time"].to_numpy(float)
        _rolling(ttft, done, ok["ttft"].to_numpy(float), "TTFT", 1.0, PALETTE[0:2])
        _rolling(tpot, done, ok["tpot"].to_numpy(float), "TPOT", 1e3, PALETTE[2:4])
        edges = np.arange(0, end + 1.0, 1.0)
        counts = np.zeros(len(edges) - 1)
        for _, r in ok.iterrows():  # each request's tokens spread evenly between its first token and its end
            grid = np.linspace(r["send_time"] + r["ttft"], r["finish_time"], max(int(r["output_tokens"]), 1))
            counts += np.histogram(grid, edges)[0]
        tokens.step(edges[:-1], counts, where="post", color=PALETTE[4], label="output tokens")
    if len(scrapes) and "lab_kv_blocks_used" in scrapes:
        blocks.plot(scrapes["t"], scrapes["lab_kv_blocks_used"], color=PALETTE[5], label="KV blocks in use")
    for col, colour, style in (("lab_num_requests_running", PALETTE[6], "-"), ("lab_num_requests_waiting", PALETTE[7], "--")):
        if len(scrapes) and col in scrapes:  # dashed over solid: both show where they are equal (often 0)
            queue.plot(scrapes["t"], scrapes[col], color=colour, ls=style, label=col.removeprefix("lab_num_requests_"))
    ttft.set(title="time to first token", ylabel="TTFT (s)")
    tpot.set(title="time per output token", ylabel="TPOT (ms)")
    tokens.set(title="output tokens per second", ylabel="throughput (tokens/s, 1-s bins)")
    blocks.set(title="KV cache (from /metrics)", ylabel="KV blocks in use (count)")
    queue.set(title="requests (from /metrics)", ylabel="requests (count)")
    for ax in (ttft, tpot, tokens, blocks, queue):
        ax.set_xlim(0, end)
        ax.set_ylim(bottom=0)
        # a few /metrics polls milliseconds apart would otherwise give an axis of milliseconds whose labels overlap
        ax.xaxis.set_major_locator(MaxNLocator(nbins=6))
        ax.tick_params(labelbottom=True)
        ax.set_xlabel("time since the load started (s)")
        if len(ax.lines) > 1:
            legend_outside(ax)
    fig.suptitle(f"{title}: the load over time", fontsize=10)
    fig.tight_layout()
    return fig
