"""The worker `lab.bench.vllm_peer` runs inside vLLM's own environment (its CPU build pins its own torch, so it
cannot share the lab's process): it imports nothing from the lab, loads the model once and answers one timing
request per line until told to quit.

Protocol (JSON lines): its first line is {"ready": true, "vllm": version}; each request
{"prompts": [[token ids]], "max_tokens": n} is answered by {"seconds", "new_tokens", "step_s"}: every prompt
queued at once (greedy, EOS ignored) and the engine stepped until all finish, as `LLM.generate` steps it, with the
time each request's tokens arrive kept, so `step_s` is the mean gap between a request's tokens after its first
(the engine's TPOT, as the lab and its `transformers` peer measure it), averaged over the requests.
{"quit": true} ends it. vLLM's own logging goes to stderr: stdout carries the protocol alone.
"""

import json
import os
import sys
import time


def _serve(args: dict, proto) -> None:
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # No prefix caching, as the lab's engine runs the workloads: each timed run follows a warm-up on the same
    # prompts, and vLLM caches prefixes by default, so its 2K prefill was timed as a cache hit (0.37 s against the
    # lab's and `transformers`' 2.6 s, on 6 December).
    llm = LLM(model=args["model"], dtype=args["dtype"], max_model_len=args["max_model_len"],
              max_num_seqs=args["max_num_seqs"], seed=0, enable_prefix_caching=False)
    engine = llm.llm_engine

    def run(prompts, max_tokens):
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        arrivals = {}  # request id -> [time each new token arrived]
        counts = {}
        t = time.perf_counter()
        for i, p in enumerate(prompts):
            engine.add_request(f"lab-{time.monotonic_ns()}-{i}", TokensPrompt(prompt_token_ids=p), params)
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter()
            for o in outputs:
                n = len(o.outputs[0].token_ids)  # cumulative: the tokens so far
                if n > counts.get(o.request_id, 0):
                    arrivals.setdefault(o.request_id, []).extend([now] * (n - counts.get(o.request_id, 0)))
                    counts[o.request_id] = n
        seconds = time.perf_counter() - t
        gaps = [(ts[-1] - ts[0]) / (len(ts) - 1) for ts in arrivals.values() if len(ts) > 1]
        return {"seconds": seconds, "new_tokens": sum(counts.values()),
                "step_s": sum(gaps) / len(gaps) if gaps else None}

    proto.write(json.dumps({"ready": True, "vllm": vllm.__version__}) + "\n")
    proto.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):
            break
        run(request["prompts"], min(4, request["max_tokens"]))  # warm-up: the rounds interleave it with others
        proto.write(json.dumps(run(request["prompts"], request["max_tokens"])) + "\n")
        proto.flush()


def main() -> None:
    proto = os.fdopen(os.dup(1), "w")  # the protocol's own copy of stdout
    os.dup2(2, 1)  # everything else printed (vLLM's logs, C libraries) goes to stderr
    _serve(json.loads(sys.argv[1]), proto)


if __name__ == "__main__":
    main()
