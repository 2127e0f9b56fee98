"""`lab.bench.rounds`: every contender timed once a round, interleaved, the order rotated between rounds, and each
workload's rounds combined into medians with their span."""
import pytest

from lab.bench.rounds import combine, per_round_ratio, rotated, run_rounds
from lab.bench.workloads import Workload


class _Fake:
    def __init__(self, label, order):
        self.label, self.order = label, order

    def measure(self, w):
        self.order.append((self.label, w.name))
        return {"seconds": float(len(self.order)), "new_tokens": 4, "step_s": None, "value": float(len(self.order))}

    def close(self):
        pass


def test_rounds_interleave_every_contender_and_rotate_who_goes_first():
    order = []
    a, b, c = _Fake("a", order), _Fake("b", order), _Fake("c", order)
    ws = [Workload("x", 1, 2), Workload("y", 1, 2)]
    seen = []
    out = run_rounds([a, b, c], ws, 3, lambda cont, w, r, m: seen.append((cont.label, w.name, r)))
    assert order[:6] == [("a", "x"), ("b", "x"), ("c", "x"), ("a", "y"), ("b", "y"), ("c", "y")]
    assert order[6:9] == [("b", "x"), ("c", "x"), ("a", "x")] and order[12:15] == [("c", "x"), ("a", "x"), ("b", "x")]
    assert len(seen) == 18 and {r for *_, r in seen} == {0, 1, 2}
    assert [len(out[k]["x"]) for k in "abc"] == [3, 3, 3]
    with pytest.raises(ValueError, match="rounds must be >= 1, got 0"):
        run_rounds([a], ws, 0)


def test_combine_takes_medians_and_keeps_the_span_and_per_round_ratios_pair_rounds():
    m = combine([{"seconds": 3.0, "step_s": None, "value": 30.0}, {"seconds": 1.0, "step_s": None, "value": 10.0},
                 {"seconds": 2.0, "step_s": None, "value": 20.0}])
    assert m == {"seconds": 2.0, "value": 20.0, "span": [10.0, 30.0], "values": [30.0, 10.0, 20.0], "rounds": 3}
    assert per_round_ratio([2.0, 4.0], [4.0, 8.0], lower_is_better=True)["values"] == [2.0, 2.0]
    assert per_round_ratio([2.0, 4.0], [4.0, 8.0], lower_is_better=False)["value"] == 0.5
    assert rotated([1, 2, 3], 4) == [2, 3, 1]
    with pytest.raises(ValueError, match="same rounds on both sides, got 2 and 1"):
        per_round_ratio([1.0, 2.0], [1.0], lower_is_better=True)


def test_lab_bench_machine_prints_the_probe_and_refuses_an_unknown_dtype(capsys):
    """`.ci/run` prints this beside every stage's time: a time without the hour's speed means little here."""
    from lab.cli import main

    assert main(["bench", "machine", "--seconds", "0.2", "--dtypes", "float32"]) == 0
    line = capsys.readouterr().out
    assert line.startswith("machine probe (float32, ") and "GFLOP/s" in line and "GB/s" in line
    assert main(["bench", "machine", "--dtypes", "int3"]) == 2
    assert "dtype 'int3' is not one of" in capsys.readouterr().err
