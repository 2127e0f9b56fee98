"""A lab model handed to transformers (`lab.models.hf_export`): the same weights under Hugging Face's names in
transformers' own class, so `lab bench engine` can time transformers beside the engine on a `random:` model with
no checkpoint to carry (issue 38 item 5)."""

import pytest
import torch

from lab.models import load_model
from lab.models.hf_export import to_transformers
from lab.models.reference import forward_logits


@pytest.mark.parametrize("preset", ["tiny", "smollm2-135m"])  # untied head; SmolLM2's tied one
def test_transformers_computes_the_lab_models_logits(preset):
    net, _ = load_model(f"random:{preset}", dtype=torch.float32, device="cpu")
    hf = to_transformers(net)
    ids = list(range(3, 60))
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(net, ids) - theirs).abs().max().item() <= 1e-4
    assert (hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()) == net.config.tie_word_embeddings


def test_an_architecture_it_cannot_hand_over_is_refused_by_name():
    net, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    net.config.architecture = "Phi3ForCausalLM"  # fused checkpoint names: not the Llama layout
    with pytest.raises(ValueError, match="cannot hand a Phi3ForCausalLM to transformers yet; exportable: Llama"):
        to_transformers(net)


def test_the_transformers_peers_decode_step_is_positive_however_noisy_the_clock(monkeypatch):
    """The peer's decode step was (time of m tokens - time of 1 token) / (m - 1) over two runs, which came out
    zero or negative when noise between the runs exceeded the m - 1 steps (seen on a tiny model under load). A
    clock on which every call to `generate` takes the same time, whatever it does, gave a step of 0 ms; the step
    now comes from the gaps between the tokens of one run."""
    import itertools

    import lab.bench.peers as peers
    from lab.bench.workloads import Workload

    ticks = itertools.count()
    monkeypatch.setattr(peers.time, "perf_counter", lambda: float(next(ticks)))  # one second a call
    w = Workload("decode-1", 1, 5, metric="step_ms")
    assert peers.TransformersPeer("random:tiny", "float32", [w]).measure(w)["value"] == 1e3  # 1 s between tokens


def test_the_transformers_peer_runs_on_a_random_model_and_agrees_with_the_engine():
    from lab.bench.workloads import Workload, prompt_ids
    from lab.bench.peers import TransformersPeer, _batch
    from lab.engine import LLM, SamplingParams

    workloads = [Workload("decode-1", 1, 5, metric="step_ms"), Workload("offline-32x128", 3, 4)]
    peer = TransformersPeer("random:tiny", "float32", workloads)
    assert peer.label == "transformers-float32" and all(peer.measure(w)["value"] > 0 for w in workloads)
    # the same greedy tokens from the engine and from transformers on the same random weights
    net, _ = load_model("random:tiny", dtype=torch.float32, device="cpu")
    prompts = prompt_ids(workloads[1], None, net.config.vocab_size)
    ours = [o.token_ids for o in LLM("random:tiny", dtype="float32").generate(
        prompts, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))]
    with torch.inference_mode():
        out = to_transformers(net).generate(**_batch(None, prompts), max_new_tokens=4, min_new_tokens=4,
                                            do_sample=False, pad_token_id=0)
    assert ours == out[:, len(prompts[0]):].tolist()
