#!/bin/bash
set -e
PY=/work/main/.venv/bin/python
for round in 8 9; do
  for side in new old; do
    dir=$([ $side = old ] && echo /tmp/old || echo /work/main)
    (cd $dir && PYTHONPATH=$dir $PY -m lab.cli bench engine --variants eager-auto --workloads decode-1,offline-32x128 \
       --transformers '' --json /tmp/ab/${side}_$round.json > /tmp/ab/${side}_$round.log 2>&1)
    echo "$side round $round done $(date +%T)"
  done
done
