"""The batched sampler: a step's logits in, each sequence's next tokens and their logprobs out, together.

After vLLM v1's `Sampler` (vllm/v1/sample/sampler.py), in three stages over the rows the step sampled:

1. The grammar mask, contributed by extensions (`EngineExtension.mask_logits`, structured output), in place on
   every sampled row, drafts' rows included. vLLM v1 applies its grammar bitmask before the sampler too, so
   logprobs are the masked distribution's.
2. A chooser per sequence: an extension's verification (`process_logits`, speculative decoding) chooses its
   tokens in place of sampling; every other sequence samples one token from its last row. For those rows, the
   logprobs are taken from the masked logits, then the logits processors run in order on the batch
   (`PROCESSORS`: penalties, min_tokens, logit_bias), then greedy rows take the argmax (one batched call) and
   sampled rows apply temperature, top-k and top-p together (`sampling_probs`) and draw: unseeded rows in one
   `torch.multinomial`, a seeded row from its own generator, so its tokens do not depend on the batch.
3. Logprobs of the chosen tokens (`token_logprobs`), before penalties and temperature (vLLM's default
   "raw" logprobs), returned with the tokens: nothing waits on the side for `LLM._append`.

Top-p is nucleus sampling (Holtzman et al., "The Curious Case of Neural Text Degeneration", 2020): keep the
smallest set of most likely tokens whose probability reaches p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .request import Logprob, SamplingParams, Sequence


@dataclass
class Sampled:
    tokens: list[int]
    logprobs: list[dict[int, Logprob]] | None  # one entry a token, if the request asked for logprobs


# ---- logits processors: each changes one row of a sequence's logits in place, in this order ----------------
def repetition_and_occurrence_penalties(row: torch.Tensor, seq: Sequence, stop_ids: set[int]) -> None:
    """vLLM's (and OpenAI's) penalties: repetition (CTRL, Keskar et al. 2019) divides the positive and multiplies
    the negative logits of every token in the prompt or output; presence subtracts once per token already
    generated, frequency once per occurrence."""
    p = seq.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.token_ids)), device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
    out = seq.output_token_ids
    if out and (p.presence_penalty or p.frequency_penalty):
        ids, counts = torch.tensor(out, device=row.device).unique(return_counts=True)
        row[ids] -= p.presence_penalty + p.frequency_penalty * counts.to(row.dtype)


def min_tokens(row: torch.Tensor, seq: Sequence, stop_ids: set[int]) -> None:
    """EOS and the request's stop tokens are impossible until min_tokens are out."""
    stops = stop_ids | set(seq.params.stop_token_ids)
    if seq.num_output_tokens < seq.params.min_tokens and stops:
        row[torch.tensor(sorted(stops), device=row.device)] = float("-inf")


def logit_bias(row: torch.Tensor, seq: Sequence, stop_ids: set[int]) -> None:
    """OpenAI's logit_bias: a number added to the logit of each token named."""
    bias = seq.params.logit_bias
    row[torch.tensor(list(bias), device=row.device)] += torch.tensor(list(bias.values()), dtype=row.dtype,
                                                                       device=row.device)


PROCESSORS = (  # (does this request need it, what it does)
    (lambda p: bool(p.presence_penalty or p.frequency_penalty or p.repetition_penalty != 1.0),
     repetition_and_occurrence_penalties),
    (lambda p: p.min_tokens > 0, min_tokens),
    (lambda p: bool(p.logit_bias), logit_bias),
)


def processed(params: SamplingParams) -> bool:
    """Whether a logits processor changes this request's logits (speculative verification runs none yet)."""
    return any(wanted(params) for wanted, _ in PROCESSORS)


# ---- choosers -----------------------------------------------------------------------------------------------
def _filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Rows of `logits` [n, vocab] with what falls outside each row's top-k and top-p at -inf (k <= 0 or >= vocab
    and p = 1 leave a row alone)."""
    vocab = logits.shape[-1]
    cut_k = (top_k > 0) & (top_k < vocab)
    if bool(cut_k.any()):
        # Each row's k-th largest logit from a top-k as deep as the largest k asked, not a sort of the vocabulary:
        # on 128 rows of SmolLM2's 49,152 logits, one thread, the sort took 496 ms and topk(3) 12 ms. The values
        # are the sort's, so ties at the k-th stay in, as before.
        k = top_k.clamp(1, vocab)
        deepest = int(k[cut_k].max())
        kth = logits.topk(deepest, -1).values.gather(-1, (k.clamp(max=deepest) - 1)[:, None])
        logits = logits.masked_fill(cut_k[:, None] & (logits < kth), float("-inf"))
    cut_p = top_p < 1.0
    if bool(cut_p.any()):
        rows = cut_p.nonzero()[:, 0]  # top-p needs the whole order: sorted are only the rows that ask for it
        ranked, order = logits[rows].sort(-1, descending=True)
        probs = ranked.softmax(-1)
        # Drop a token when the tokens before it already reach top_p; the first always stays.
        drop = (probs.cumsum(-1) - probs) >= top_p[rows, None]
        logits = logits.index_put((rows,), logits[rows].masked_fill(
            torch.zeros_like(drop).scatter(-1, order, drop), float("-inf")))
    return logits


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The distribution each sampled row of `logits` [n, vocab] draws from: its temperature, top-k and top-p
    applied, all rows at once."""
    dev = logits.device
    temperature = torch.tensor([p.temperature for p in params], dtype=logits.dtype, device=dev)
    top_k = torch.tensor([p.top_k for p in params], device=dev)
    top_p = torch.tensor([p.top_p for p in params], dtype=logits.dtype, device=dev)
    return _filter_top_k_top_p(logits / temperature[:, None], top_k, top_p).softmax(-1)


def probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution `choose` draws from, for each row of `logits` [n, vocab] of one request: one-hot at the
    argmax for a greedy request (what speculative verification compares drafts against)."""
    if p.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    return sampling_probs(logits, [p] * logits.shape[0])


def choose(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]) -> list[int]:
    """One token per row of `logits` [B, vocab] (float32); a row's generator lives on the logits' device."""
    tokens = logits.argmax(-1).tolist()  # greedy rows are done here, in one batched call
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if not rows:
        return tokens
    probs = sampling_probs(logits[rows], [params[i] for i in rows])
    free = [j for j, i in enumerate(rows) if generators[i] is None]
    if free:  # rows without a seed share the global generator: one draw for all of them
        for j, t in zip(free, torch.multinomial(probs[free], 1)[:, 0].tolist()):
            tokens[rows[j]] = t
    for j, i in enumerate(rows):
        if generators[i] is not None:  # a seeded row draws from its own stream, whatever else is in the batch
            tokens[i] = int(torch.multinomial(probs[j], 1, generator=generators[i]))
    return tokens


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[dict[int, Logprob]]:
    """For row i of `logits` [n, vocab] and the token chosen there: {token: Logprob} for it and the `top` most
    likely tokens (vLLM's shape: the chosen token is always in the dict, with its rank)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = []
    for row, token in zip(logp, tokens):
        chosen = float(row[token])
        entry = {token: Logprob(chosen, 1 + int((row > row[token]).sum()))}
        if top:
            values, ids = row.topk(top)
            for r, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
                entry.setdefault(t, Logprob(v, r))
        out.append(entry)
    return out


class Sampler:
    def __init__(self, stop_ids: set[int]):
        """`stop_ids`: the model's EOS tokens (min_tokens keeps them out). The extensions a sequence takes part in
        (`Sequence.extensions`) contribute its grammar mask and may verify its rows instead."""
        self.stop_ids = stop_ids

    def __call__(self, logits: torch.Tensor, rows: list[tuple[Sequence, slice]]) -> dict[int, Sampled]:
        """`rows`: each sequence that emits this step and its rows of `logits` [step rows, vocab] (the last one
        predicts its next token; more rows verify drafts). Returns request id -> what it emits."""
        for seq, r in rows:
            for ext in seq.extensions:
                ext.mask_logits(seq, logits[r])  # in place: a view of the step's logits
        out, plain = {}, []
        for seq, r in rows:
            tokens = next((t for ext in seq.extensions if (t := ext.process_logits(seq, logits[r])) is not None),
                          None)
            if tokens is None:
                plain.append((seq, r.stop - 1))
            else:  # the j-th verified token was chosen at the j-th row
                out[seq.request_id] = Sampled(tokens, self._logprobs(seq, logits[r][:len(tokens)], tokens))
        if plain:
            out.update(self._sample(logits, plain))
        return out

    def _sample(self, logits: torch.Tensor, plain: list[tuple[Sequence, int]]) -> dict[int, Sampled]:
        seqs = [seq for seq, _ in plain]
        masked = logits[[row for _, row in plain]]  # a copy: the processors below leave the step's logits alone
        processed = masked
        for i, seq in enumerate(seqs):
            for wanted, process in PROCESSORS:
                if wanted(seq.params):
                    if processed is masked:
                        processed = masked.clone()  # logprobs come from the masked logits
                    process(processed[i], seq, self.stop_ids)
        tokens = choose(processed, [s.params for s in seqs], [s.generator(logits.device) for s in seqs])
        return {seq.request_id: Sampled([t], self._logprobs(seq, masked[i:i + 1], [t]))
                for i, (seq, t) in enumerate(zip(seqs, tokens))}

    @staticmethod
    def _logprobs(seq: Sequence, logits: torch.Tensor, tokens: list[int]) -> list[dict[int, Logprob]] | None:
        return None if seq.logprobs is None else token_logprobs(logits, tokens, seq.params.logprobs)
