"""Notebook 08's logic without processes: the per-rank memory account, the bubble table, the projection.
(The notebook itself runs at the smoke preset in tests/test_notebooks.py; the engine's shards are checked against
the same account in tests/test_tensor_parallel.py.)"""

import pytest

from lab import memory as mem
from lab.studies import parallelism as study


def test_rank_memory_adds_up_to_the_whole_model():
    for name, tp in (("llama-3-70b", 8), ("smollm2-135m", 2), ("smollm2-135m", 3), ("llama-3-8b", 4)):
        shape = mem.ModelShape.preset(name)
        ranks = study.rank_memory(shape, tp)
        whole = mem.weight_bytes(shape, "bf16")
        norms = whole["router_and_norms"]  # replicated on every rank
        assert ranks["weight bytes"].sum() == pytest.approx(whole["total"] + (tp - 1) * norms)
        assert ranks["KV bytes per token"].sum() == pytest.approx(mem.kv_bytes_per_token(shape, "bf16"))
    smol = study.rank_memory(mem.ModelShape.preset("smollm2-135m"), 2)
    assert list(smol["KV bytes per token"]) == [2 * 30 * 2 * 64 * 2, 2 * 30 * 1 * 64 * 2]  # 2 of 3 KV heads on rank 0


def test_bubble_table_and_projection():
    table = study.bubble_model(2, (1, 2, 8))
    assert list(table["bubble (model)"]) == pytest.approx([1 / 2, 1 / 3, 1 / 9]) and list(table["m >= 4p"]) == [False, False, True]
    p = study.ParallelParams()
    proj = study.projection(p)
    assert set(proj["link"]) == {"nvlink-h100x8", "pcie5-h100x8"} and len(proj) == 2 * len(p.PROJECT_BATCHES)
    by = proj.set_index(["link", "batch"])
    assert by.loc[("pcie5-h100x8", 256), "comm share"] > by.loc[("nvlink-h100x8", 256), "comm share"]
    assert (proj["all-reduces"] == 2 * 80 + 1).all()


def test_params_refuse_bad_values_by_name():
    with pytest.raises(ValueError, match="unknown model 'llama-9'"):
        study.ParallelParams(PROJECT_MODEL="llama-9")
    with pytest.raises(ValueError, match="PP_BATCH=0"):
        study.ParallelParams(PP_BATCH=0)
