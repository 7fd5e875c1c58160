#!/usr/bin/env python3
"""JSON-lines vs Avro-container input equivalence on the random streams (decode-garbage lines dropped)."""
import json, os, subprocess, sys, tempfile
import difftest, avrofile
d = tempfile.mkdtemp(prefix="avro-")
bad = tot = 0
for cname in sys.argv[1].split(","):
    fl = difftest.CONFIGS[cname]
    for seed in range(int(sys.argv[2])):
        lines = [l for l in difftest.gen(seed, fl) if l.strip()]
        recs, jl = [], []
        for l in lines:
            try:
                o = json.loads(l)
                r = avrofile.record(o.get("event_id") or "", o.get("entity_id") or "", o["amount_minor"], o.get("currency") or "", o["event_time"])
                if not (isinstance(o["amount_minor"], int) and isinstance(o["event_time"], int)): continue
            except Exception:
                continue
            recs.append(r); jl.append(l)
        avrofile.write(os.path.join(d, "in.avro"), recs)
        open(os.path.join(d, "in.jsonl"), "wb").write(b"\n".join(jl) + b"\n")
        res = []
        for ext in ("avro", "jsonl"):
            cmd = [difftest.VC, "replay", "--quiet", "--input-file", os.path.join(d, "in." + ext), "--output", os.path.join(d, ext + ".out.jsonl"), "--dlq", os.path.join(d, ext + ".dlq.jsonl")]
            for k, v in fl.items():
                if not k.startswith("_"): cmd += ["--" + k, v]
            subprocess.run(cmd, capture_output=True, check=True)
            f = [json.loads(x) for x in open(os.path.join(d, ext + ".out.jsonl"))]
            for x in f: x.pop("source_topic")
            q = [(json.loads(x)["reason"], json.loads(x)["source_offset"]) for x in open(os.path.join(d, ext + ".dlq.jsonl"))]
            res.append((f, q))
        tot += 1
        if res[0] != res[1]:
            bad += 1
            print("DIFF", cname, seed)
print("avro-vs-jsonl: %d/%d equal" % (tot - bad, tot))
sys.exit(1 if bad else 0)
