"""Parallelism across processes on `torch.distributed` (issue 22).

Tensor parallelism, Megatron-style (Shoeybi et al., 2019, arXiv:1909.08053): `sharding` splits a `LlamaModel` by
whole KV groups, intermediate features and vocabulary rows; `layers` are the row-parallel projections, the
vocabulary-parallel embedding and the gathered LM head. Pipeline parallelism, GPipe-style (Huang et al., 2019,
arXiv:1811.06965): `pipeline` splits the layers into stages and pushes a step's micro-batches through them. Both
share `collectives` (every all-reduce, gather, broadcast, send and receive timed, under a timeout), `worker`
(ranks 1 .. N - 1) and `group` (rank 0's side: start, step, failure, close). The engine uses them through
`LLM(model, tensor_parallel_size=N)` or `pipeline_parallel_size=N` (`lab.engine.parallel`); this package does not
import the engine.

`comm_model` and `comm_bench` are the alpha-beta model of what the collectives cost and its measurement.
"""
