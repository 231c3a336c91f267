#!/usr/bin/env python3
# What bounds a run: the busy seconds of each track of a `strata train --trace` file (its spans merged where they
# overlap) against the trace's wall span. usage: benchmarks/trace_tracks.py TRACE.json
import json, sys, collections
ev = json.load(open(sys.argv[1]))
ev = ev["traceEvents"] if isinstance(ev, dict) else ev
names = {}
spans = collections.defaultdict(list)
for e in ev:
    if e.get("ph") == "M" and e.get("name") == "thread_name":
        names[(e.get("pid"), e.get("tid"))] = e["args"]["name"]
    elif e.get("ph") == "X":
        spans[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e.get("dur", 0)))
lo = min(s for v in spans.values() for s, _ in v); hi = max(t for v in spans.values() for _, t in v)
print(f"wall {(hi - lo) / 1e6:.1f} s")
for k, v in sorted(spans.items(), key=lambda kv: str(names.get(kv[0], kv[0]))):
    v.sort(); busy = 0; cs, ce = v[0]
    for s, t in v[1:]:
        if s > ce: busy += ce - cs; cs, ce = s, t
        else: ce = max(ce, t)
    busy += ce - cs
    print(f"{str(names.get(k, k)):<28} busy {busy / 1e6:8.1f} s  ({100 * busy / (hi - lo):5.1f}%)  {len(v)} events")
