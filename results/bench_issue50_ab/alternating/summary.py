import json, glob, statistics, sys, re
d = sys.argv[1] if len(sys.argv) > 1 else str(__import__('pathlib').Path(__file__).parent)
rounds = sorted({int(re.search(r'_(\d+)\.json', f).group(1)) for f in glob.glob(f'{d}/*_*.json')})
rows = {}
for r in rounds:
    try:
        o = json.load(open(f'{d}/old_{r}.json'))['result']['engines'][0]
        n = json.load(open(f'{d}/new_{r}.json'))['result']['engines'][0]
    except FileNotFoundError:
        continue
    first = 'old' if r % 2 == 0 else 'new'
    for w in ('decode-1', 'offline-32x128'):
        rows.setdefault(w, []).append((r, first, o['workloads'][w]['value'], n['workloads'][w]['value']))
for w, rs in rows.items():
    ratios = [n / o for _, _, o, n in rs]
    print(f"{w} ({'ms/step' if w == 'decode-1' else 'tok/s'}): rounds {[r for r, *_ in rs]}")
    for r, first, o, n in rs:
        print(f"  round {r} ({first} first): old {o:.2f} new {n:.2f} new/old {n / o:.3f}")
    by = {f: [n / o for _, ff, o, n in rs if ff == f] for f in ('old', 'new')}
    print(f"  new/old median {statistics.median(ratios):.3f}, range {min(ratios):.3f}-{max(ratios):.3f}; "
          f"old first: {[round(x, 3) for x in by['old']]}, new first: {[round(x, 3) for x in by['new']]}")
