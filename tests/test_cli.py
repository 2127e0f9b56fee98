"""The `lab` console command, run as a user runs it."""

import json
import subprocess
import sys


def run_lab(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_the_commands():
    out = run_lab("--help")
    assert out.returncode == 0
    assert "generate" in out.stdout and "bench" in out.stdout


def test_generate_prints_text_and_metrics_as_json():
    out = run_lab("generate", "What is 2 + 2?", "--max-tokens", "6", "--json")
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout.strip().splitlines()[-1])
    assert record["prompt"] == "What is 2 + 2?"
    assert 1 <= len(record["token_ids"]) <= 6 and isinstance(record["text"], str)
    assert record["metrics"]["ttft"] > 0


def test_bad_input_is_a_clear_error_not_a_traceback():
    out = run_lab("generate", "hello", "--max-tokens", "5000", "--max-model-len", "256")
    assert out.returncode == 2
    assert "max_model_len 256" in out.stderr and "Traceback" not in out.stderr


def test_eval_reports_perplexity_and_kl_with_intervals_as_strict_json():
    out = run_lab("eval", "smollm2-135m", "--suite", "ppl", "--kv-cache-dtype", "int4/per-token", "--json")
    assert out.returncode == 0, out.stderr

    def no_nan(constant):
        raise AssertionError(f"{constant} is not JSON")

    ppl = json.loads(out.stdout, parse_constant=no_nan)["ppl"]  # the reference: the model with an exact cache
    assert ppl["n_sequences"] == 8 and ppl["reference_perplexity"] < ppl["perplexity"]
    for name in ("perplexity", "kl_mean", "top1_agreement", "reference_perplexity"):
        assert ppl[f"{name}_low"] <= ppl[name] <= ppl[f"{name}_high"], name
    assert ppl["kl_mean"] > 0 and ppl["top1_agreement"] < 1
