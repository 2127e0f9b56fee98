"""`lab checkpoint`: a small random-weight 16-bit checkpoint with a tokenizer, to try the workbench's one switch
(`lab run all --model DIR`) before pointing it at a real model (`lab.models.random_checkpoint`)."""

from __future__ import annotations


def _checkpoint(args) -> int:
    from lab.models.random_checkpoint import write_random_checkpoint

    out = write_random_checkpoint(args.out, family=args.family, dtype=args.dtype, hidden_size=args.hidden_size,
                                  num_layers=args.layers)
    print(f"wrote {out}: random {args.family} weights in {args.dtype}, SmolLM2's tokenizer; try "
          f"`lab run all --preset smoke --model {out} --results-dir {out}-runs`")
    return 0


def add_checkpoint(sub) -> None:
    """`lab checkpoint OUT [--family F] [--dtype D]`"""
    from lab.models.random_checkpoint import DTYPES, FAMILIES

    ck = sub.add_parser("checkpoint", help="write a small random-weight 16-bit checkpoint (Hugging Face format, with "
                                           "a tokenizer) to try `lab run all --model` on (docs/your_model.md)")
    ck.add_argument("out", help="the directory to write")
    ck.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    ck.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    ck.add_argument("--hidden-size", type=int, default=64)
    ck.add_argument("--layers", type=int, default=4)
    ck.set_defaults(func=_checkpoint)
