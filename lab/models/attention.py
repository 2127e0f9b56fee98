"""Attention in plain PyTorch: the math every attention backend in the lab must reproduce, over contiguous K/V
and over the engine's paged pool.

**Causal attention.** softmax(q k^T / sqrt(d) + mask) v, where query i of a chunk of T new tokens that follows
`offset` cached tokens may see keys 0 .. offset + i (Vaswani et al., 2017). Grouped-query attention (Ainslie
et al., 2023) lets each group of n_heads / n_kv_heads query heads share one key/value head. The contiguous
reference (`lab.models.reference`), the KV-quantization study and the replay microbenchmark call it directly.

**Paged attention** (Kwon et al., "Efficient Memory Management for LLM Serving with PagedAttention", SOSP 2023),
the engine's torch backend. The KV pool of one layer is [num_blocks, block_size, n_kv_heads, head_dim]: in the
model's dtype (`lab.kv.plain`, which writes and reads it as nano-vllm's attention layer does its cache), or
quantized codes with scales (`lab.kv.fp8`, `lab.kv.integer`); any `lab.kv.KVStore` offers the same two operations,
and says through its `capabilities` whether sliding windows and soft caps may read it. A sequence's token j
lives in block `block_table[j // block_size]` at offset `j % block_size`. Each step:

1. write: this step's k, v go to their slots (`slot_mapping`, one flat index per token);
2. read: decodes (one query each) are batched, gathering whole blocks through the padded block
   tables and masking positions past each sequence's length; a prefill chunk gathers its own blocks
   and runs causal attention with the chunk's queries at the end of its context. Decodes of very different
   lengths are batched in groups (`length_groups`), so a short one is not padded to the longest.

Quantized formats with a full-precision window or per-channel keys also read exact K/V from the store's
staging area (`lab.kv.staging.StagingMetadata`): a decode overwrites the gathered K/V at the positions it
reads exactly, a prefill chunk, whose queries each read a different window, chooses per (query, key)
(`partly_exact_attention`). Which positions are exact the store says (`exact_mask`, from `lab.kv.format`).

Gathering copies the context once per layer, which a fused kernel would not (the Triton backend
reads blocks in place); the math is the same and this is what the kernels are tested against.

A model's `AttentionLayout` (sliding windows per layer, Gemma 2's logit soft cap) applies to both: a windowed
decode masks the keys before its window as it masks those past its end, a windowed prefill chunk gathers only the
blocks from its first query's window on (blocks before it may have been freed,
`lab.engine.scheduler.BlockManager`), and a soft cap computes the scores itself, since SDPA has none. The
quantized formats' exact-copy paths take neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

NEG_INF = float("-inf")


@dataclass(frozen=True)
class AttentionLayout:
    """What a model's attention adds to plain causal attention, per layer of its KV pool.

    `windows[layer]`: a sliding window of W keys — the query at position p sees keys p - W + 1 .. p (Beltagy et
    al., "Longformer", 2020; Mistral 7B, Jiang et al., 2023; transformers' sliding_window_overlay: kv > q - W) —
    or None for the whole causal context. `softcap`: Gemma 2's soft cap on the attention logits, cap *
    tanh(scores / cap) after the 1/sqrt(d) scale and before the mask (Gemma Team, arXiv:2408.00118, section 2)."""

    windows: tuple[int | None, ...] = ()
    softcap: float | None = None

    def window(self, layer: int) -> int | None:
        return self.windows[layer] if layer < len(self.windows) else None

    @property
    def plain(self) -> bool:
        return self.softcap is None and not any(self.windows)


def attention_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[Tq, Tk] True where the query at q_pos may see the key at k_pos: causal, within `window` if one."""
    mask = k_pos[None, :] <= q_pos[:, None]
    return mask if window is None else mask & (k_pos[None, :] > q_pos[:, None] - window)


def check_plain(layout: AttentionLayout, layer: int, num_keys: int, where: str) -> None:
    """Refuse, by name, attention code that computes plain causal attention where `layout` would change the result
    at `num_keys` keys: a soft cap, or a window narrower than the keys (a window that never binds changes nothing)."""
    window = layout.window(layer)
    if layout.softcap is not None or (window is not None and num_keys > window):
        what = "a logit soft cap" if layout.softcap is not None else f"a sliding window of {window} keys"
        raise ValueError(f"{where} computes plain causal attention, but layer {layer} of this model has {what}, "
                         f"which changes attention over {num_keys} keys; it is not implemented there")


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     softcap: float | None) -> torch.Tensor:
    """softmax(cap(q k^T / sqrt(d)) masked) v, the scores in float32: SDPA has no soft cap. q [B, H, Tq, d], k, v
    [B, H_kv, Tk, d] (grouped-query heads repeated here), mask broadcastable to [B, H, Tq, Tk]."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask, NEG_INF)
    return torch.matmul(scores.softmax(-1).to(q.dtype), v)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None = None,
                     softcap: float | None = None, q_positions: torch.Tensor | None = None) -> torch.Tensor:
    """q [T, n_heads, d] are the last T positions of the S keys/values k, v [S, n_kv_heads, d], or those at
    `q_positions` [T] if given (e.g. a sample of them); each query sees the last `window` keys up to itself if a
    window is given, and its scores are soft-capped if `softcap`."""
    T, S = q.shape[0], k.shape[0]
    if window is not None and window >= S:
        window = None  # no query can reach past it
    # A batch dimension of 1: SDPA's fused CPU kernel takes only 4-D inputs; 3-D ones fall back to the math path,
    # which materializes the T x S scores (measured: a 2048-token prefill's attention 0.32 s a layer, 0.04 s 4-D).
    qh, kh, vh = (x.transpose(0, 1)[None] for x in (q, k, v))
    if window is None and softcap is None and q_positions is None and T == S:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=True)
    else:
        pos = torch.arange(S, device=q.device)
        # Query i sits at position S - T + i, unless placed elsewhere, and sees keys 0 .. its position.
        mask = attention_mask(pos[S - T:] if q_positions is None else q_positions, pos, window)
        if softcap is None:
            out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True)
        else:
            out = capped_attention(qh, kh, vh, mask, softcap)
    return out[0].transpose(0, 1)


def partly_exact_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, exact_keys: torch.Tensor,
                           exact_values: torch.Tensor, key_exact: torch.Tensor | None,
                           value_exact: torch.Tensor | None, block: int = 1024,
                           q_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention over a quantized cache in which each query reads some keys and values exactly.

    q [T, n_heads, d] are the last T of S positions; keys, values [S, n_kv_heads, d] are as read from the
    quantized cache and exact_keys, exact_values the full-precision ones; key_exact, value_exact [T, S] say
    where query i reads the exact one (None: nowhere). A full-precision window (KIVI) differs per query, so
    this cannot be one gathered K/V: scores against the exact keys replace the quantized ones where the mask
    says, and the exact values correct the output there. Exact reads sit in a band near the diagonal, so
    `block` queries at a time compute them only over the columns where that block has any, and only up to
    the block's last visible key (which also keeps the scores of 8K tokens within memory). `q_positions`
    [T] (increasing) places the queries elsewhere than the last T positions, e.g. a sample of them. Where nothing
    is read exactly it is SDPA's causal attention (`causal_attention`), the engine's kernel and its rounding: on the
    EPYC of 7 December 0.62 s against 1.95 s blocked for one layer's 8K-token attention, 0.16 s against 0.54 s for
    every 8th of those queries."""
    if key_exact is None and value_exact is None:
        return causal_attention(q, keys, values, q_positions=q_positions)
    T, n_heads, d = q.shape
    S, n_kv = keys.shape[:2]
    group = n_heads // n_kv
    if q_positions is None:
        q_positions = torch.arange(S - T, S, device=q.device)
    out = torch.empty_like(q)
    for a in range(0, T, block):
        b = min(a + block, T)
        end = int(q_positions[b - 1]) + 1  # keys this block of queries can see
        km = None if key_exact is None else key_exact[a:b, :end]
        vm = None if value_exact is None else value_exact[a:b, :end]
        lo = min((int(m.any(0).nonzero()[0, 0]) for m in (km, vm) if m is not None and m.any()), default=end)
        future = torch.arange(end, device=q.device)[None, :] > q_positions[a:b, None]
        for h in range(n_kv):
            heads = slice(h * group, (h + 1) * group)
            qh = q[a:b, heads].transpose(0, 1).float() * d ** -0.5  # [group, block, d]
            scores = qh @ keys[:end, h].float().t()
            if km is not None and lo < end:
                # where(), not a blend: the quantized side may hold a key group still filling (never read).
                band = qh @ exact_keys[lo:end, h].float().t()
                scores[..., lo:end] = torch.where(km[:, lo:end], band, scores[..., lo:end])
            p = scores.masked_fill_(future, NEG_INF).softmax(-1)
            o = p @ values[:end, h].float()
            if vm is not None and lo < end:
                o += (p[..., lo:end] * vm[:, lo:end]) @ (exact_values[lo:end, h].float() - values[lo:end, h].float())
            out[a:b, heads] = o.transpose(0, 1).to(q.dtype)
    return out


# A new group of decodes starts only where it saves at least this many padded (sequence, position) reads a layer.
# A group costs a gather, two copies and two matmuls more a layer: at SmolLM2's 3 KV heads of 64, one thread on
# the Xeon of 7 December, a one-block decode's attention took 37-40 us and each padded position 0.9 (bf16) to
# 1.6 us (float32), so a group costs what 25-50 positions do. Twenty times that keeps a split from costing more
# than it saves, and more or wider KV heads make a position dearer, not a group.
MIN_PADDING_SAVED = 1024


def length_groups(lens: list[int]) -> tuple[tuple[tuple[int, ...], int], ...] | None:
    """Decodes of context lengths `lens` in groups batched apart: ((indices into `lens`, the group's longest
    length), ...), longest first, or None for one batch of all. Batched together, every decode is padded to the
    longest; one 2K-token context among a hundred of 100 tokens makes each read 2K positions a layer. Going from
    the longest down, a group ends before the first length at most half its longest, when the decodes left
    (each padded to the group's longest otherwise) would save at least MIN_PADDING_SAVED positions. So a decode is
    padded to more than twice its length only where splitting it off would save less than that, and a batch of
    like lengths stays one."""
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    groups, start = [], 0
    for k in range(1, len(order)):
        span, n = lens[order[start]], lens[order[k]]
        if 2 * n <= span and (len(order) - k) * (span - n) >= MIN_PADDING_SAVED:
            groups.append((tuple(sorted(order[start:k])), span))
            start = k
    if not groups:
        return None
    return tuple(groups) + ((tuple(sorted(order[start:])), lens[order[start]]),)


@dataclass
class PagedAttentionMetadata:
    """Everything attention needs about a step's batch, built once per step by the model runner."""

    slot_mapping: torch.Tensor  # [T] flat slot of each new token
    positions: torch.Tensor  # [T] position of each new token in its sequence (pre-RoPE KV formats need it)
    decode_rows: torch.Tensor  # [Bd] token index of each single-query sequence
    decode_blocks: torch.Tensor  # [Bd * max_blocks] the decodes' block tables, flattened (padded with block 0)
    decode_bias: torch.Tensor  # [Bd, 1, 1, max_blocks * block_size] 0 inside the context, -inf past its end
    decode_lens: torch.Tensor  # [Bd] context length of each decode, its new token included
    prefills: list[tuple[int, int, torch.Tensor, int]]  # (first token row, query length, block ids, context length)
    staging: object | None = None  # lab.kv.staging.StagingMetadata of a staging store
    max_decode_len: int = 0  # decode_lens.max(), kept on the host: reading it from a device stalls the step
    decode_groups: tuple | None = None  # `length_groups(decode lengths)`, on the host: None batches all decodes


class TorchPagedAttention:
    """An `AttentionContext` over the engine's paged KV cache: any `lab.kv.KVStore`."""

    def __init__(self, store, meta: PagedAttentionMetadata, layout: AttentionLayout | None = None):
        self.store, self.meta, self.layout = store, meta, layout or AttentionLayout()
        if not self.layout.plain and not store.capabilities.attention_layouts:
            raise ValueError(f"kv_cache_dtype {store.fmt.dtype} keeps exact copies or pre-RoPE keys, which the lab's "
                             f"sliding windows and soft-capped attention do not read; use a format without them")
        self._window_bias: dict[int, torch.Tensor] = {}  # window -> decode bias, built once a step
        self._groups: list | None = None  # the decode groups' rows as tensors, built once a step

    def decode_bias(self, window: int | None) -> torch.Tensor:
        """The decodes' bias, -inf also before the window: the query at position len - 1 sees keys >= len - W."""
        if window is None:
            return self.meta.decode_bias
        if window not in self._window_bias:
            m = self.meta
            before = torch.arange(m.decode_bias.shape[-1], device=m.decode_bias.device)[None, :] < (
                m.decode_lens[:, None] - window)
            self._window_bias[window] = m.decode_bias.masked_fill(before[:, None, None, :], float("-inf"))
        return self._window_bias[window]

    def attend(self, layer, q, k, v):
        m, st = self.meta, self.meta.staging
        n_kv, d = k.shape[-2:]
        window, softcap = self.layout.window(layer), self.layout.softcap
        exact = None
        if st is not None:
            exact = self.store.exact_source(layer, st, k, v)
            self.store.stage(layer, st, k, v)
        self.store.write(layer, m.slot_mapping, k, v, m.positions, st, None if exact is None else exact[0])
        bd = m.decode_rows.numel()
        if bd:
            # The n_heads / n_kv query heads that share a KV head become the query rows of that head:
            # one small matmul per (sequence, KV head) and no copy of K/V per query head.
            qd = (q if not m.prefills else q[m.decode_rows]).view(bd, n_kv, -1, d)
            if m.decode_groups:
                o, tables, bias = torch.empty_like(qd), m.decode_blocks.view(bd, -1), self.decode_bias(window)
                for rows, span in self._group_rows():
                    n = -(-span // self.store.block_size)
                    o[rows] = self._decode(layer, qd[rows], tables[rows, :n].reshape(-1), n,
                                           bias[rows, ..., :n * self.store.block_size], softcap, exact, rows)
            else:
                o = self._decode(layer, qd, m.decode_blocks, m.decode_blocks.numel() // bd, self.decode_bias(window),
                                 softcap, exact)
            o = o.view(bd, -1, d)
            if not m.prefills:
                return o
        out = torch.empty_like(q)
        if bd:
            out[m.decode_rows] = o
        for i, (start, qlen, blocks, ctx_len) in enumerate(m.prefills):
            # A window: from the block holding the first key the chunk's first query sees (the ones before it may
            # be freed); the chunk's queries are still the last of the keys gathered.
            first = 0 if window is None else max(0, ctx_len - qlen - window + 1) // self.store.block_size
            keys, values = self.store.gather(layer, blocks[first:] if first else blocks)
            span = ctx_len - first * self.store.block_size if first else ctx_len
            keys, values = keys.view(-1, n_kv, d)[:span], values.view(-1, n_kv, d)[:span]
            qc = q[start:start + qlen]
            if st is None:
                out[start:start + qlen] = causal_attention(qc, keys, values, window, softcap)
                continue
            rows, first = st.prefill_spans[i]
            k_pos = torch.arange(ctx_len, device=q.device)[None, :]
            q_pos = k_pos[:, ctx_len - qlen:].t()
            exact_kv, masks = [], []
            for x, src, role in ((keys, exact[0], "k"), (values, exact[1], "v")):
                full = x.clone()
                full[first:ctx_len] = src.index_select(0, rows)
                exact_kv.append(full)
                mask = self.store.exact_mask(role, q_pos, k_pos)
                masks.append(None if mask is None else mask & (k_pos >= first))  # staged copies start at `first`
            out[start:start + qlen] = partly_exact_attention(qc, keys, values, *exact_kv, *masks)
        return out

    def _group_rows(self) -> list[tuple[torch.Tensor, int]]:
        """The metadata's decode groups with their rows as index tensors, made once a step."""
        if self._groups is None:
            device = self.meta.decode_rows.device
            self._groups = [(torch.tensor(rows, device=device), span) for rows, span in self.meta.decode_groups]
        return self._groups

    def _decode(self, layer, qd, blocks, per_sequence: int, bias, softcap, exact=None, rows=None) -> torch.Tensor:
        """Attention of the decodes qd [n, n_kv, group, d] over their `per_sequence` blocks each: the step's
        decodes at `rows` (None: all of them). With a staging store, `exact` holds the step's exact copies."""
        m, st = self.meta, self.meta.staging
        n, n_kv, _, d = qd.shape
        keys, values = self.store.gather(layer, blocks, per_sequence)
        if st is not None:
            decode_rows, src_rows, k_pos = m.decode_rows, st.decode_rows, st.decode_positions
            if rows is not None:
                decode_rows, src_rows, k_pos = decode_rows[rows], src_rows[rows], k_pos[rows]
            q_pos = m.positions[decode_rows][:, None]
            for x, src, role in ((keys, exact[0], "k"), (values, exact[1], "v")):
                mask = self.store.exact_mask(role, q_pos, k_pos)
                _overwrite_exact(x.view(n, -1, n_kv, d), src, k_pos, src_rows, mask)
        # [n, n_kv, L, d], copied while rows of d stay whole: a strided view would make matmul copy K^T
        # element by element (3 ms of a 31 ms bf16 step at batch 32 went to that copy). Same values in bf16;
        # float32 sums in another order (~1e-6).
        keys = keys.view(n, -1, n_kv, d).transpose(1, 2).contiguous()
        values = values.view(n, -1, n_kv, d).transpose(1, 2).contiguous()
        return _decode_attention(qd, keys, values, bias, softcap)


def _decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                      softcap: float | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v for the decodes, q [Bd, n_kv, group, d]. One sequence: SDPA's fused
    kernel. Several: two batched matmuls with the softmax in float32, which on this CPU took 0.36 ms where SDPA's
    flash kernel took 1.0 ms (bfloat16, 32 sequences of 208 tokens, one thread; 2.4 vs 6.1 ms at 1024 tokens;
    float32 the same speed either way): the flash kernel tiles for long queries, a decode has `group` of them.
    A soft cap goes between the scale and the bias, so SDPA cannot take it."""
    if q.shape[0] == 1 and softcap is None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
    scores = torch.matmul(q, keys.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)
    if softcap is not None:
        scores = torch.tanh(scores.div_(softcap)).mul_(softcap)
    scores.add_(bias)
    return torch.matmul(scores.softmax(-1).to(q.dtype), values)


def _overwrite_exact(x: torch.Tensor, src: torch.Tensor, positions: torch.Tensor, src_rows: torch.Tensor,
                     mask: torch.Tensor | None) -> None:
    """x [n, L, n_kv, d] gathered for n decodes: where `mask` [n, S] says so, the staged exact copy of the
    position in `positions` [n, S] (-1: unused), at row `src_rows` [n, S] of the exact source `src`."""
    if mask is None:
        return
    mask = mask & (positions >= 0)
    b = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(mask)
    x[b[mask], positions[mask]] = src.index_select(0, src_rows[mask])
