"""The lab's model against transformers: logits, greedy continuations, conversion and loading."""

import json

import pytest
import torch

from lab.models import ModelConfig, load_model, resolve_model_dir
from lab.models.reference import forward_logits, greedy_generate


@pytest.fixture(scope="module")
def hf_smollm():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_dir("smollm2-135m"), dtype=torch.float32).eval()


def test_config_of_embedded_model():
    c = ModelConfig.from_json(resolve_model_dir("smollm2-135m") / "config.json")
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (30, 576, 9, 3, 64)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0 and c.eos_token_ids == [2]


def test_logits_match_transformers(smollm, hf_smollm, chat_prompt_ids):
    model, _ = smollm
    for ids in chat_prompt_ids:
        ours = forward_logits(model, ids)
        with torch.inference_mode():
            theirs = hf_smollm(torch.tensor([ids])).logits[0]
        assert (ours - theirs).abs().max().item() <= 1e-3


def test_greedy_matches_transformers_generate(smollm, hf_smollm, chat_prompt_ids):
    model, _ = smollm
    n = 24
    for ids in chat_prompt_ids[1:3]:
        with torch.inference_mode():
            theirs = hf_smollm.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False)[0, len(ids):].tolist()
        ours = greedy_generate(model, ids, n)
        assert len(theirs) >= 8, "transformers stopped too early for a meaningful comparison"
        assert ours[:len(theirs)] == theirs


def test_gguf_conversion_matches_transformers_own_gguf_loader(smollm, chat_prompt_ids):
    """transformers dequantizes and un-permutes the GGUF itself; our converter must agree with it."""
    pytest.importorskip("accelerate")
    from transformers import AutoModelForCausalLM

    from lab.models.loader import embedded_gguf_path

    path = embedded_gguf_path("smollm2-135m")
    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    model, _ = smollm
    ids = chat_prompt_ids[0]
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(model, ids) - theirs).abs().max().item() <= 1e-3


def test_tokenizer_round_trip_and_chat_template(smollm):
    _, tok = smollm
    text = "Paged attention stores KV in blocks."
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat.startswith("<|im_start|>system") and chat.endswith("<|im_start|>assistant\n")


def test_the_converted_tokenizer_is_autotokenizers_read_back_by_class(smollm):
    """A GGUF conversion's tokenizer loads by the class its SOURCE.json names, without the model's transformers
    config (whose import pulls torch.distributed.tensor and sympy): the same class, chat text and ids as
    AutoTokenizer gives on the directory."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    _, tok = smollm
    model_dir = resolve_model_dir("smollm2-135m")
    auto = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    assert json.loads((model_dir / "SOURCE.json").read_text())["tokenizer_class"] == type(auto).__name__
    assert type(tok) is type(auto) and tok.all_special_ids == auto.all_special_ids
    chat = [{"role": "user", "content": "Größe of 3 <b>blocks</b>?"}, {"role": "assistant", "content": "Twelve."}]
    assert tok.apply_chat_template(chat, tokenize=False) == auto.apply_chat_template(chat, tokenize=False)
    text = auto.apply_chat_template(chat, tokenize=False)
    assert tok.encode(text) == auto.encode(text) and tok.decode(auto.encode(text)) == text
    code = ("import sys\nfrom lab.models.loader import load_tokenizer, resolve_model_dir\n"
            "load_tokenizer(resolve_model_dir('smollm2-135m'))\nprint('sympy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], out.stdout + out.stderr


def test_a_recorded_class_this_transformers_lacks_falls_back_to_autotokenizer(tmp_path):
    import shutil

    from lab.models.loader import load_tokenizer

    model_dir = resolve_model_dir("smollm2-135m")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "config.json"):
        shutil.copy(model_dir / name, tmp_path / name)
    (tmp_path / "SOURCE.json").write_text(json.dumps({"tokenizer_class": "NoSuchTokenizerClass"}))
    tok = load_tokenizer(tmp_path)
    assert type(tok).__name__ == json.loads((model_dir / "SOURCE.json").read_text())["tokenizer_class"]
    assert tok.encode("paged attention") == load_tokenizer(model_dir).encode("paged attention")


def test_second_load_reads_the_converted_cache(monkeypatch):
    """The GGUF is converted once; later loads read the cached safetensors (no timing asserted: the point is
    that the conversion does not run again)."""
    from lab.models import loader

    load_model("smollm2-135m", device="cpu")  # converted already (session fixture or this call)

    def convert_again(*args):
        raise AssertionError("the GGUF was converted a second time")

    monkeypatch.setattr(loader, "convert_gguf", convert_again)
    model, tok = load_model("smollm2-135m", device="cpu")
    assert model.config.num_hidden_layers == 30 and tok is not None


def test_a_conversion_finished_by_another_process_first_is_kept(tmp_path):
    """Two processes (the test workers, two notebooks) may convert the same GGUF at once: the one that finishes
    second keeps the first's copy instead of failing on the occupied directory, and leaves no partial files."""
    from lab.models.gguf import convert_gguf
    from lab.models.loader import embedded_gguf_path

    out = tmp_path / "model"
    out.mkdir()
    (out / "config.json").write_text("{}")  # what the other process's finished conversion left
    assert convert_gguf(embedded_gguf_path("smollm2-135m"), out) == out
    assert (out / "config.json").read_text() == "{}" and [p.name for p in tmp_path.iterdir()] == ["model"]


def _save_tiny_hf(tmp_path, config):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for p in hf.parameters():  # large enough weights that a wrong layout shows in the logits
            p.normal_(0, 0.1)
    hf.save_pretrained(tmp_path)
    return hf


@pytest.mark.parametrize("kind", ["llama3-rope", "qwen2-bias"])
def test_local_hf_directory_matches_transformers(tmp_path, kind):
    from transformers import LlamaConfig, Qwen2Config

    common = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama3-rope":
        config = LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
                             rope_theta=500000.0)
    else:
        config = Qwen2Config(**common, tie_word_embeddings=True)
    hf = _save_tiny_hf(tmp_path, config)
    model, tok = load_model(tmp_path, device="cpu", dtype=torch.float32)  # the comparison is numerical: float32
    assert tok is None
    ids = list(range(3, 100))
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(model, ids) - theirs).abs().max().item() <= 1e-4


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "hidden_size": 8,
                                                      "num_attention_heads": 2, "num_key_value_heads": 2}))
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        load_model(tmp_path, device="cpu")


def test_random_preset_and_unknown_names():
    model, tok = load_model("random:tiny", device="cpu")
    assert tok is None and model.config.num_key_value_heads == 3
    with pytest.raises(ValueError, match="tiny"):
        load_model("random:no-such-shape")
    with pytest.raises(ValueError, match="smollm2-135m"):
        load_model("no-such-model")


def test_checkpoints_as_people_have_them_sharded_with_generation_eos(tmp_path):
    """Issue 37 item 2: a checkpoint in several safetensors shards (with model.safetensors.index.json) loads as one,
    and generation_config.json's EOS list (a chat model's end-of-turn tokens) joins config.json's."""
    import json as _json

    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig

    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, eos_token_id=2)
    hf = _save_tiny_hf(tmp_path / "one", config)
    hf.save_pretrained(tmp_path, max_shard_size="40KB")  # in shards
    GenerationConfig(eos_token_id=[2, 7, 9]).save_pretrained(tmp_path)
    index = _json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((tmp_path / s).exists() for s in shards), shards
    # a file the index does not name (left by an earlier save) is not read: the index says what the model is
    save_file({"model.norm.weight": torch.zeros(3)}, tmp_path / "model.safetensors")
    model, _ = load_model(tmp_path, device="cpu", dtype=torch.float32)
    ids = list(range(3, 60))
    with torch.inference_mode():
        theirs = hf(torch.tensor([ids])).logits[0]
    assert (forward_logits(model, ids) - theirs).abs().max().item() <= 1e-4
    assert model.config.eos_token_ids == [2, 7, 9]


def test_loading_a_checkpoint_builds_no_compiler_and_a_rank_loads_no_tokenizer(user16):
    """A fresh process that loads a checkpoint (the model built on the meta device, then filled) does not import
    torch._dynamo (torch.compile's front end): nn.Embedding's initialisation on meta did, 1.7 s of each rank,
    server and notebook process that never compiles. A load without the tokenizer, as a parallel rank's, does not
    import transformers either (about 1 s). What the loads give is checked elsewhere
    (test_local_hf_directory_matches_transformers, the engine's tests)."""
    import subprocess
    import sys

    code = ("import sys, torch\nfrom lab.models import load_model\n"
            f"net, tok = load_model({str(user16)!r}, dtype='float32', tokenizer=False)\n"
            "print(tok is None, 'transformers' in sys.modules)\n"
            f"net, tok = load_model({str(user16)!r}, dtype='float32')\n"
            "print(tok is not None, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "True", "False"], out.stdout + out.stderr
