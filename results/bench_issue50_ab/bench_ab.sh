#!/bin/bash
# Same-run A/B of the engine benchmark: the commit before issue 50's engine changes (A, /tmp/old) and this tree (B),
# interleaved A B A B so drift between rounds moves both.
set -e
PY=/work/main/.venv/bin/python
ARGS="bench engine --variants eager-auto --workloads decode-1,offline-32x128 --transformers ''"
for round in 5 6 7; do
  for side in old new; do
    dir=$([ $side = old ] && echo /tmp/old || echo /work/main)
    (cd $dir && PYTHONPATH=$dir $PY -m lab.cli bench engine --variants eager-auto --workloads decode-1,offline-32x128 \
       --transformers '' --json /tmp/ab/${side}_$round.json > /tmp/ab/${side}_$round.log 2>&1)
    echo "$side round $round done $(date +%T)"
  done
done
