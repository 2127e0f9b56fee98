#!/bin/bash
# Same-machine A/B of `lab bench engine`, rounds alternating which side runs first (ABBA...), nothing else running.
# old: `git worktree add /tmp/old 251dd1d` (the commit before issue 50's engine changes); new: /work/main at 3da2952
# (issue 50's engine, the same engine code as the relayout after it). Each side is its own process, ~28 s.
set -e
PY=/work/main/.venv/bin/python
for round in 10 11 12 13 14 15 16 17; do
  if [ $((round % 2)) = 0 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    dir=$([ $side = old ] && echo /tmp/old || echo /work/main)
    (cd $dir && PYTHONPATH=$dir $PY -m lab.cli bench engine --variants eager-auto --workloads decode-1,offline-32x128 \
       --transformers '' --json /tmp/ab2/${side}_$round.json > /tmp/ab2/${side}_$round.log 2>&1)
    echo "$side round $round done $(date +%T)"
  done
done
echo done
