"""Joins bench_router.py --trace (the client's lines) with the router's and fronts' lines of
sitecustomize.py: where the slowest burst requests through the router spent their time.

    python3 analyse.py BENCH_TRACE TRACE_DIR
"""

import json
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path

clients = [json.loads(line) for line in open(sys.argv[1])]
forwarded = defaultdict(list)
for path in Path(sys.argv[2]).glob("*.jsonl"):
    for line in path.open():
        row = json.loads(line)
        forwarded[row["port"]].append(row)

rows = []
for c in clients:
    if c["way"] != "router":
        continue
    near = [f for f in forwarded.get(c["port"], []) if f.get("conn") and f.get("send")
            and abs(f["start"] - c["sent"]) < 5]
    if not near:
        continue
    f = min(near, key=lambda f: abs(f["start"] - c["sent"]))
    ms = lambda a, b: (b - a) * 1e3  # noqa: E731
    rows.append({"round": c["round"], "via": f["via"], "total": ms(c["sent"], c["upstream"]),
                 "to_accept": ms(c["sent"], f["conn"]), "parse": ms(f["conn"], f["start"]),
                 "acquire": ms(f["start"], f["send"]), "upstream": ms(f["send"], c["upstream"]),
                 "sent": c["sent"]})

print(f"{len(rows)} router requests joined of {sum(c['way'] == 'router' for c in clients)}")
parts = ("to_accept", "parse", "acquire", "upstream")
for q in (50, 90, 99):
    print(f"p{q}: " + "  ".join(
        f"{k} {statistics.quantiles([r[k] for r in rows], n=100)[q - 1]:6.2f}"
        for k in ("total", *parts)))
rows.sort(key=lambda r: -r["total"])
print("the 12 slowest (ms): total = to_accept + parse + acquire + upstream; via; round")
for r in rows[:12]:
    print(f"  {r['total']:6.2f} = {r['to_accept']:6.2f} + {r['parse']:5.2f} + "
          f"{r['acquire']:6.2f} + {r['upstream']:6.2f}  {r['via']:18} round {r['round']}")
for round_ in sorted({r["round"] for r in rows}):
    these = [r for r in rows if r["round"] == round_]
    start = min(r["sent"] for r in these)
    by = Counter(r["via"] for r in these)
    print(f"round {round_}: by process {dict(sorted(by.items()))}; sends spread over "
          f"{(max(r['sent'] for r in these) - start) * 1e3:.1f} ms; mean acquire "
          f"{statistics.mean(r['acquire'] for r in these):.2f} ms")
