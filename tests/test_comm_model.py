"""The alpha-beta model of collectives and the pipeline bubble (lab.parallel.comm_model), and the measurement of
this machine's collectives over torch.distributed (lab.parallel.comm_bench)."""

import math

import numpy as np
import pytest

from lab.machine.hardware import GPUS
from lab.memory import ModelShape
from lab.parallel import comm_bench
from lab.parallel.comm_model import (LINKS, Link, allgather_seconds, allreduce_seconds, alpha_for_share,
                                     fit_alpha_beta, pipeline_bubble, send_seconds, tp_comm_seconds, tp_decode_step)

LINK = Link("test", alpha=10e-6, bandwidth=100e9)


def test_collective_costs_follow_the_ring_factors():
    n = 1e6
    assert allreduce_seconds(n, 8, LINK) == pytest.approx(10e-6 + n * 2 * 7 / 8 / 100e9)
    assert allgather_seconds(n, 8, LINK) == pytest.approx(10e-6 + n * 7 / 8 / 100e9)
    assert send_seconds(n, LINK) == pytest.approx(10e-6 + 1e-5)
    assert allreduce_seconds(n, 1, LINK) == allgather_seconds(n, 1, LINK) == 0.0
    with pytest.raises(ValueError, match="bandwidth > 0"):
        Link("bad", 1e-6, 0)


def test_pipeline_bubble():
    assert pipeline_bubble(1, 7) == 0
    assert pipeline_bubble(2, 1) == 0.5
    assert pipeline_bubble(4, 16) == pytest.approx(3 / 19)  # the article's rule, m = 4p: about 16%
    assert pipeline_bubble(8, 32) == pytest.approx(7 / 39)
    with pytest.raises(ValueError, match="got 0 and 4"):
        pipeline_bubble(0, 4)


def test_fit_recovers_alpha_and_bandwidth():
    sizes = np.array([4 ** k for k in range(1, 12)], dtype=float)
    times = 50e-6 + sizes / 2e9
    alpha, bw = fit_alpha_beta(sizes, times)
    assert alpha == pytest.approx(50e-6, rel=1e-6) and bw == pytest.approx(2e9, rel=1e-6)
    alpha, bw = fit_alpha_beta(sizes, 50e-6 + sizes * 1.5 / 2e9, factor=1.5)
    assert bw == pytest.approx(2e9, rel=1e-6)
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_alpha_beta([8, 8], [1e-5, 2e-5])


def test_tp_step_counts_two_allreduces_a_layer():
    smol = ModelShape.preset("smollm2-135m")
    seconds, n_ar, each, gather = tp_comm_seconds(smol, 2, tokens=4, link=LINK)
    assert n_ar == 2 * 30 + 1 and each == 4 * 576 * 2 and gather == 4 * 49152 * 4
    assert seconds == pytest.approx(n_ar * allreduce_seconds(each, 2, LINK) + allgather_seconds(gather, 2, LINK))
    assert tp_comm_seconds(smol, 1, 4, LINK)[0] == 0


def test_alpha_for_share_inverts_the_step_model():
    llama70 = ModelShape.preset("llama-3-70b")
    hw, link = GPUS["h100-sxm"], LINKS["nvlink-h100x8"]
    alpha = alpha_for_share(llama70, hw, 8, batch=1, context=2048, link=link, share=0.4)
    step = tp_decode_step(llama70, hw, 8, 1, 2048, Link("x", alpha, link.bandwidth))
    assert step.comm_share == pytest.approx(0.4, rel=1e-9)
    slower = tp_decode_step(llama70, hw, 8, 1, 2048, Link("x", 2 * alpha, link.bandwidth))
    assert slower.comm_share > 0.4 and math.isfinite(slower.seconds)
    pcie = tp_decode_step(llama70, hw, 8, 1, 2048, LINKS["pcie5-h100x8"])
    assert pcie.comm_share > tp_decode_step(llama70, hw, 8, 1, 2048, link).comm_share


def test_measure_collectives_on_two_processes():
    df = comm_bench.measure(2, sizes=(16, 65536), repeats=3)
    assert set(df["op"]) == {"ping-pong", "all-reduce", "all-reduce between matmuls"} and len(df) == 6
    assert (df["median_s"] > 0).all() and (df["min_s"] <= df["median_s"]).all()
    fitted = comm_bench.fit(df, 2)
    assert set(fitted["op"]) == set(df["op"]) and (fitted["bandwidth_GBps"] > 0).all()
    assert set(fitted["statistic"]) == {"median", "mean"} and (df["mean_s"] >= df["min_s"]).all()
    with pytest.raises(ValueError, match="world=1"):
        comm_bench.measure(1)
