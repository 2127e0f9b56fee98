"""How a `LlamaModel` is split over N tensor-parallel ranks (Megatron-LM: Shoeybi et al., 2019, arXiv:1909.08053).

Per decoder layer, with x the layer's input replicated on every rank:

- attention: q/k/v are column-parallel by whole KV groups. Rank r holds KV heads [k0, k1) and the query heads
  that read them, [k0 g, k1 g) with g = n_heads / n_kv, so its attention needs nothing from the other ranks;
  o_proj is row-parallel (the columns of those query heads), and the partial outputs are summed by one
  all-reduce;
- MLP: gate and up are column-parallel over the intermediate features [i0, i1), down_proj row-parallel over the
  same features, one all-reduce;
- the embedding is vocabulary-parallel: rank r holds rows [v0, v1), looks up the ids inside that slice, zeroes
  the others and all-reduces; the LM head (the same slice, tied or not) gives each rank its vocabulary slice of
  the logits, which rank 0 gathers. Norms are replicated.

Uneven splits are allowed where the work is still whole heads: SmolLM2-135M's 3 KV heads over 2 ranks give rank 0
KV heads {0, 1} with their 6 query heads and rank 1 KV head {2} with its 3 (vLLM refuses a head count that the
degree does not divide; the lab accepts the imbalance, which shows as rank 0 waiting less in the all-reduces).
With more ranks than KV heads each KV head is replicated on N / n_kv ranks (N must be a multiple of n_kv) that
split its g query heads evenly (g must be a multiple of N / n_kv). Anything else is refused with the numbers.

Families (`lab.models.families`): per-head q/k norms (Qwen3) act on whole heads and are replicated like the other
norms; Phi-3 is the Llama layer. OLMo 2's q/k norms span all heads (a rank would need the others' sums of squares)
and a mixture of experts would be split by experts, which the lab does not do: both are refused by name
(`check_shardable`).

A shard is a `LlamaModel` built from a per-rank config (its heads, features, vocabulary slice), so its layers and
its KV pool have the rank's shapes; its `config` is then set back to the whole model's, which is what the engine
and its extensions reason about (the vocabulary, the layer count).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from lab.memory import ModelShape
from lab.models.families import FAMILIES
from lab.models.llama import LlamaModel, RMSNorm

from .layers import GatheredLMHead, RowParallelLinear, VocabParallelEmbedding


def split(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of each of `parts` near-equal contiguous pieces of range(n), the larger ones first."""
    sizes = [n // parts + (i < n % parts) for i in range(parts)]
    starts = [sum(sizes[:i]) for i in range(parts)]
    return [(s, s + z) for s, z in zip(starts, sizes)]


@dataclass(frozen=True)
class RankShard:
    """What one rank holds: heads, intermediate features and vocabulary rows, each as [start, end)."""

    q_heads: tuple[int, int]
    kv_heads: tuple[int, int]
    intermediate: tuple[int, int]
    vocab: tuple[int, int]


def shardable(family) -> bool:
    """Whether tensor parallelism can split a layer of `family` by heads and features alone."""
    return family.qk_norm != "full" and family.mlp == "dense"


def check_shardable(config) -> None:
    """ValueError naming the architecture, why, and the ones that shard, for a family `shardable` refuses."""
    family = config.family
    if shardable(family):
        return
    why = ("its q/k norms span all heads, which a rank holding some heads cannot compute alone"
           if family.qk_norm == "full" else "a mixture of experts would be split by experts, which the lab does not do")
    raise ValueError(f"tensor parallelism cannot shard {config.architecture}: {why}; it shards "
                     f"{', '.join(a for a, f in FAMILIES.items() if shardable(f))}")


def plan_shards(config, world: int) -> list[RankShard]:
    """Each rank's share of a model of `config` (a `lab.models.ModelConfig`) at tensor-parallel degree `world`;
    ValueError with the numbers when the heads cannot be split into whole KV groups, and with the architecture
    when its layers cannot be split at all (`check_shardable`)."""
    check_shardable(config)
    return plan(config.num_attention_heads, config.num_key_value_heads, config.intermediate_size,
                config.vocab_size, world)


def plan(n_q: int, n_kv: int, intermediate: int, vocab: int, world: int) -> list[RankShard]:
    """`plan_shards` from the numbers (query heads, KV heads, intermediate features, vocabulary)."""
    g = n_q // n_kv
    if world <= n_kv:
        kv = split(n_kv, world)
        q = [(a * g, b * g) for a, b in kv]
    else:
        replicas = world // n_kv
        if world % n_kv or g % replicas:
            raise ValueError(
                f"tensor_parallel_size {world} cannot shard {n_q} query heads in {n_kv} KV groups: above the KV "
                f"head count it must be a multiple of it ({n_kv}, {2 * n_kv}, ...) that divides each group's "
                f"{g} query heads evenly ({world} / {n_kv} replicas per KV head)")
        kv = [(r // replicas, r // replicas + 1) for r in range(world)]
        per = g // replicas
        q = [(k * g + (r % replicas) * per, k * g + (r % replicas + 1) * per) for r, (k, _) in enumerate(kv)]
    if intermediate < world or vocab < world:
        raise ValueError(f"tensor_parallel_size {world} exceeds intermediate_size {intermediate} or vocab_size {vocab}")
    inter, rows = split(intermediate, world), split(vocab, world)
    return [RankShard(q[r], kv[r], inter[r], rows[r]) for r in range(world)]


def rank_shapes(shape: ModelShape, world: int) -> list[ModelShape]:
    """Each rank's share of a dense model as a `lab.memory.ModelShape`, so that `lab.memory`'s accounts
    (`weight_bytes`, `kv_bytes_per_token`) give per-rank numbers: norms stay whole (replicated), everything
    else is the rank's slice. MoE and MLA models are split differently (experts, a shared latent) and refused."""
    if shape.is_moe or shape.is_mla:
        raise ValueError(f"{shape.name}: per-rank shapes cover dense attention and MLPs (no MoE, no MLA)")
    return [dataclasses.replace(shape, name=f"{shape.name} rank {r} of {world}",
                                num_heads=s.q_heads[1] - s.q_heads[0], num_kv_heads=s.kv_heads[1] - s.kv_heads[0],
                                intermediate_size=s.intermediate[1] - s.intermediate[0],
                                vocab_size=s.vocab[1] - s.vocab[0], published_params=None)
            for r, s in enumerate(plan(shape.num_heads, shape.num_kv_heads, shape.intermediate_size,
                                       shape.vocab_size, world))]


def local_config(config, shard: RankShard):
    """The config of a model with only this rank's heads, features and vocabulary rows."""
    return dataclasses.replace(config, num_attention_heads=shard.q_heads[1] - shard.q_heads[0],
                               num_key_value_heads=shard.kv_heads[1] - shard.kv_heads[0],
                               intermediate_size=shard.intermediate[1] - shard.intermediate[0],
                               vocab_size=shard.vocab[1] - shard.vocab[0], head_dim=config.head_dim)


def _rows(a: int, b: int, scale: int) -> slice:
    return slice(a * scale, b * scale)


def _layer_tensors(layer, config, shard: RankShard) -> dict[str, torch.Tensor]:
    """The rank's slices of one decoder layer's tensors (state-dict names inside the layer)."""
    d, i0, i1 = config.head_dim, *shard.intermediate
    attn, mlp = layer.self_attn, layer.mlp
    q_size, kv_size = attn.q_size, attn.kv_size
    q, k = _rows(*shard.q_heads, d), _rows(*shard.kv_heads, d)
    k = slice(q_size + k.start, q_size + k.stop)
    v = slice(k.start + kv_size, k.stop + kv_size)
    inter = config.intermediate_size
    # Every norm is replicated: the layer's, and per-head q/k norms, which act on each (whole) head alike.
    out = {f"{name}.weight": m.weight for name, m in layer.named_modules() if isinstance(m, RMSNorm)}
    out |= {
        "self_attn.qkv_proj.weight": torch.cat([attn.qkv_proj.weight[s] for s in (q, k, v)]),
        "self_attn.o_proj.weight": attn.o_proj.weight[:, q],
        "mlp.gate_up_proj.weight": torch.cat([mlp.gate_up_proj.weight[i0:i1],
                                              mlp.gate_up_proj.weight[inter + i0:inter + i1]]),
        "mlp.down_proj.weight": mlp.down_proj.weight[:, i0:i1],
    }
    if attn.qkv_proj.bias is not None:
        out["self_attn.qkv_proj.bias"] = torch.cat([attn.qkv_proj.bias[s] for s in (q, k, v)])
    return out


@torch.no_grad()
def shard_model(model: LlamaModel, shard: RankShard, comm) -> LlamaModel:
    """A new `LlamaModel` holding `shard`'s slices of `model`'s weights (copies: `model` can be freed), its
    row-parallel projections, embedding and LM head communicating through `comm` (`lab.parallel.collectives`)."""
    config, (v0, v1) = model.config, shard.vocab
    local = local_config(config, shard)
    state = {"norm.weight": model.norm.weight, "embed_tokens.weight": model.embed_tokens.weight[v0:v1]}
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = model.lm_head.weight[v0:v1]
    for i, layer in enumerate(model.layers):
        state.update({f"layers.{i}.{k}": w for k, w in _layer_tensors(layer, config, shard).items()})
    net = LlamaModel.empty(local, model.embed_tokens.weight.device, model.rope.max_positions)
    missing, unexpected = net.load_state_dict({k: w.contiguous().clone() for k, w in state.items()}, strict=False,
                                              assign=True)
    if unexpected or any(k.startswith("layers.") for k in missing):  # an unsliced tensor would stay garbage
        raise ValueError(f"the shard's layers do not match the model's: missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]}")
    net.tie_weights()
    net.store_weights_transposed()
    net.embed_tokens = VocabParallelEmbedding(net.embed_tokens.weight, v0, comm)
    head = net.embed_tokens.weight if config.tie_word_embeddings else net.lm_head.weight
    net.lm_head = GatheredLMHead(head, config.vocab_size, comm)
    for layer in net.layers:
        layer.self_attn.o_proj = RowParallelLinear(layer.self_attn.o_proj, comm)
        layer.mlp.down_proj = RowParallelLinear(layer.mlp.down_proj, comm)
    net.config, net.shard = config, shard  # the engine reasons about the whole model; the layers are the rank's
    return net.eval()


def shard_for_rank(model: LlamaModel, rank: int, world: int, comm) -> LlamaModel:
    """A worker's shard (`lab.parallel.worker.WorkerSpec.build`)."""
    return shard_model(model, plan_shards(model.config, world)[rank], comm)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of a model's parameters, a tied matrix counted once."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
