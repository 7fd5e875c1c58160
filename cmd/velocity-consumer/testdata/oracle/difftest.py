#!/usr/bin/env python3
"""Differential test: velocity-consumer `replay` vs oracle.py on seeded random
adversarial JSON-lines streams.

usage: difftest.py [--seeds N] [--start S] [--config NAME[,NAME]] [--no-shrink] [-v]
"""
import argparse
import base64
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402

# The binary under test: VELOCITY_BIN, else a "vc" beside this file.
VC = os.environ.get("VELOCITY_BIN") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "vc")
T2026 = 1793491200000  # 2026-11-01T00:00:00Z

NEUTRAL = {"max-entities": "0", "entity-ttl": "100000h", "max-ahead": "100000h",
           "dedupe-horizon": "100000h", "min-event-time": "2000-01-01T00:00:00Z",
           "max-record-bytes": "1048576"}


def C(name, **kw):
    flags = dict(NEUTRAL)
    for k, v in kw.items():
        flags[k if k.startswith("_") else k.replace("_", "-")] = v
    return name, flags


CONFIGS = dict([
    C("example", windows="10s:1s,1m:10s", allowed_lateness="2s"),
    C("default", windows="1m:1s,5m:5s,1h:1m,24h:1h", allowed_lateness="1s"),
    C("odd_L0", windows="3s:1s,7s:7s", allowed_lateness="0s"),
    C("odd_ms", windows="1500ms:500ms,7s:7s,90s:3s", allowed_lateness="700ms"),
    C("apply_small", windows="3s:1s,7s:7s,10s:1s", allowed_lateness="1500ms", late="apply"),
    C("apply_example", windows="10s:1s,1m:10s", allowed_lateness="2s", late="apply"),
    C("apply_default", windows="1m:1s,5m:5s,1h:1m,24h:1h", allowed_lateness="5s", late="apply"),
    C("apply_L0", windows="3s:1s,7s:7s", allowed_lateness="0s", late="apply"),
    C("big_L", windows="10s:1s,1m:10s", allowed_lateness="30s"),
    C("negative_time", windows="3s:1s,7s:7s,1m:10s", allowed_lateness="2s",
      min_event_time="1969-12-31T00:00:00Z"),
    C("negative_apply", windows="3s:1s,7s:7s", allowed_lateness="2s", late="apply",
      min_event_time="1969-12-31T00:00:00Z"),
    C("too_large", windows="10s:1s", allowed_lateness="2s", max_record_bytes="190"),
    C("max_ahead", windows="10s:1s,1m:10s", allowed_lateness="2s", max_ahead="20s"),
    C("min_event_time", windows="10s:1s", allowed_lateness="2s",
      min_event_time="2026-11-01T00:00:00Z"),
    C("dedupe_horizon", windows="10s:1s", allowed_lateness="2s", dedupe_horizon="30s"),
    C("defaults", windows="1m:1s,5m:5s,1h:1m,24h:1h", allowed_lateness="1s", max_ahead="24h",
      dedupe_horizon="24h", entity_ttl="168h", max_entities="5000000"),
    C("long_apply", windows="1m:1s,5m:5s,1h:1m,24h:1h", allowed_lateness="3s", late="apply", _n="2000"),
    C("long_dlq", windows="10s:1s,1m:10s", allowed_lateness="2s", _n="2000"),
    C("ttl_short", windows="3s:1s,7s:7s", allowed_lateness="1s", entity_ttl="10s"),
    C("ttl_apply", windows="3s:1s,7s:7s", allowed_lateness="2s", late="apply", entity_ttl="8s"),
    C("ttl_long_apply", windows="10s:1s,1m:10s", allowed_lateness="3s", late="apply", entity_ttl="70s", _n="2000"),
])

# ---------------------------------------------------------------- generator

INVALID_EVENT_IDS = ["", "a" * 129, "é" * 65, "😀" * 33, "x" * 200]
VALID_ODD_EVENT_IDS = ["a" * 128, "é" * 64, "😀" * 32]
INVALID_ENTITIES = ["", "x" * 257, "é" * 129, "é" * 200, "😀" * 65]
VALID_ODD_ENTITIES = ["x" * 256, "é" * 128, "😀" * 64]


def windows_of(flags):
    return [oracle.Window(s) for s in flags["windows"].split(",")]


def gen(seed, flags):
    rnd = random.Random(seed)
    cfg = make_cfg(flags)
    ws = windows_of(flags)
    L = cfg.L
    maxW = max(w.W for w in ws)
    buckets = sorted({w.b for w in ws})
    part = oracle.Partition(cfg)
    n = int(flags["_n"]) if "_n" in flags else rnd.choice([20, 40, 80, 150, 300])
    ents = ["card-A", "card-B", "card-C", "acct-Ω", rnd.choice(VALID_ODD_ENTITIES), "dev-9"]
    weights = [40, 20, 10, 5, 3, 2]
    if flags["min-event-time"].startswith("1969"):
        base = -rnd.randrange(0, 20000)
    elif flags["min-event-time"].startswith("2026"):
        base = T2026 + rnd.randrange(0, 3000)
    else:
        base = T2026 + rnd.choice([0, 0, rnd.randrange(0, 10 ** 7)])
    clock = base
    lines = []
    accepted_ids = []   # ids accepted (so a copy must be a dup)
    rejected_ids = []   # ids of rejected records
    seen_times = []
    nid = 0
    huge = 0
    late_ok = flags.get("late") == "apply"
    for i in range(n):
        nid += 1
        eid = "e%d" % nid
        ent = rnd.choices(ents, weights)[0]
        r = rnd.random()
        amt = rnd.choice([rnd.randrange(0, 1000), rnd.randrange(0, 10 ** 6), 0, 1])
        if rnd.random() < 0.03 and huge < 50:
            amt = 10 ** 15
            huge += 1
        cur = rnd.choice(["EUR", "USD", ""])
        maxT = part.maxT if part.maxT is not None else clock
        wm = maxT - L
        # choose event time
        k = rnd.random()
        if k < 0.35:
            step = rnd.choice([0, rnd.randrange(0, 500), rnd.randrange(0, 3000)])
            t = maxT + step
        elif k < 0.50:   # jitter within lateness (not late)
            t = maxT - rnd.randrange(0, L + 1) if L > 0 else maxT
        elif k < 0.58:   # exactly at the watermark / just below
            t = wm - rnd.choice([0, 0, 1])
        elif k < 0.68:   # beyond lateness
            t = wm - rnd.randrange(1, 3 * L + 3 * max(buckets) + 2)
            if late_ok and rnd.random() < 0.5:
                t = wm - rnd.randrange(1, maxW + 2 * max(buckets))
        elif k < 0.76 and seen_times:   # exact tie with an earlier time
            t = rnd.choice(seen_times[-10:])
        elif k < 0.88:   # bucket boundary
            b = rnd.choice(buckets)
            t = (maxT // b + rnd.choice([0, 1, 1, 2])) * b + rnd.choice([0, 0, -1, 1])
        elif k < 0.94:   # gap longer than the largest window
            t = maxT + maxW + rnd.choice([0, 1, -1, rnd.randrange(0, maxW)])
        else:
            t = maxT + rnd.randrange(0, 20000)
        if "max-ahead" in flags and flags["max-ahead"] != NEUTRAL["max-ahead"] and rnd.random() < 0.1:
            ma = oracle.parse_duration_ms(flags["max-ahead"])
            t = maxT + ma + rnd.choice([0, 1, -1, 2])
        if flags["min-event-time"].startswith("2026") and rnd.random() < 0.15:
            t = cfg.min_event_time + rnd.choice([-1, 0, 1, -1000])
        # mutations
        m = rnd.random()
        line = None
        if m < 0.06 and accepted_ids:         # duplicate of an accepted/pending id
            eid = rnd.choice(accepted_ids[-15:])
            if rnd.random() < 0.5:
                t = wm - rnd.randrange(0, 5000)   # also late: duplicate wins
        elif m < 0.09 and part.pending:       # duplicate of an id still in the buffer
            eid = rnd.choice(part.pending)[2]["event_id"]
        elif m < 0.13 and rejected_ids:       # copy of a rejected id
            eid = rnd.choice(rejected_ids[-15:])
        elif m < 0.15:
            eid = rnd.choice(INVALID_EVENT_IDS)
        elif m < 0.17:
            eid = rnd.choice(VALID_ODD_EVENT_IDS) + str(nid)[:0]
        elif m < 0.19:
            ent = rnd.choice(INVALID_ENTITIES)
        elif m < 0.21:
            amt = rnd.choice([-1, 10 ** 15 + 1, -(10 ** 15), 10 ** 15])
        elif m < 0.22:
            cur = rnd.choice(["eur", "EURO", "E1R", "ÉUR"])
        elif m < 0.235:
            line = rnd.choice(["garbage", "[1,2]", '{"event_id":"%s"}' % eid,
                               '{"event_id":"%s","entity_id":"x","amount_minor":1.5,"event_time":%d}' % (eid, t),
                               '{"event_id":"%s","entity_id":"x","amount_minor":1,"event_time":"%d"}' % (eid, t)])
        elif m < 0.245 and flags["max-record-bytes"] != NEUTRAL["max-record-bytes"]:
            pass
        if line is None:
            obj = {"event_id": eid, "entity_id": ent, "amount_minor": amt, "currency": cur,
                   "event_time": t}
            if rnd.random() < 0.1:
                obj["note"] = "x" * rnd.randrange(0, 60)
            line = json.dumps(obj, ensure_ascii=rnd.random() < 0.5)
        raw = line.encode()
        lines.append(raw)
        before_feat = len(part.dlq)
        part.process(raw)
        if len(part.dlq) > before_feat:
            try:
                rejected_ids.append(json.loads(line).get("event_id"))
            except Exception:
                pass
            rejected_ids = [x for x in rejected_ids if isinstance(x, str)]
        else:
            accepted_ids.append(eid)
            seen_times.append(t)
        if rnd.random() < 0.02:
            lines.append(b"")       # blank line: not an offset
        clock = t
    return lines


# ---------------------------------------------------------------- runners

def make_cfg(flags, topic="in.jsonl"):
    return oracle.Config(flags["windows"], flags["allowed-lateness"], flags.get("late", "dlq"),
                         flags["max-ahead"], flags["min-event-time"], flags["dedupe-horizon"],
                         int(flags["max-record-bytes"]), topic,
                         entity_ttl=flags["entity-ttl"])


def run_product(lines, flags, d):
    inp = os.path.join(d, "in.jsonl")
    out = os.path.join(d, "out.jsonl")
    dlq = os.path.join(d, "dlq.jsonl")
    for f in (out, dlq):
        if os.path.exists(f):
            os.remove(f)
    with open(inp, "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    cmd = [VC, "replay", "--quiet", "--input-file", inp, "--output", out, "--dlq", dlq]
    for k, v in flags.items():
        if not k.startswith("_"):
            cmd += ["--" + k, v]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, None, p.stderr
    feats = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
    dl = []
    if os.path.exists(dlq):
        for l in open(dlq):
            r = json.loads(l)
            dl.append({"reason": r["reason"], "source_offset": r["source_offset"],
                       "key": r.get("key"), "value": r.get("value")})
    return feats, dl, None


def run_oracle(lines, flags):
    return oracle.run(lines, make_cfg(flags))


def compare(lines, flags, d):
    """returns None if equal else a description string"""
    pf, pd, err = run_product(lines, flags, d)
    if err is not None:
        return "product failed: " + err.strip()[-400:]
    of, od = run_oracle(lines, flags)
    nrec = sum(1 for l in lines if l.strip())
    offs = sorted([r["source_offset"] for r in pf] + [r["source_offset"] for r in pd])
    if offs != list(range(nrec)):
        return "ACCOUNTING: product offsets %s != 0..%d" % (offs, nrec - 1)
    for i, (a, b) in enumerate(zip(pf, of)):
        if a != b:
            return "features[%d] differ:\n  product: %s\n  oracle : %s" % (
                i, json.dumps(a, ensure_ascii=False), json.dumps(b, ensure_ascii=False))
    if len(pf) != len(of):
        return "features length product %d oracle %d; extra: %s" % (
            len(pf), len(of), json.dumps((pf[len(of):] or of[len(pf):])[0], ensure_ascii=False))
    for i, (a, b) in enumerate(zip(pd, od)):
        if a != b:
            return "dlq[%d] differ:\n  product: %s\n  oracle : %s" % (i, brief(a), brief(b))
    if len(pd) != len(od):
        return "dlq length product %d oracle %d" % (len(pd), len(od))
    return None


def brief(r):
    r = dict(r)
    for k in ("key", "value"):
        if r.get(k):
            r[k] = base64.b64decode(r[k]).decode("utf-8", "replace")[:120]
    return json.dumps(r, ensure_ascii=False)


def ddmin(lines, pred):
    """classic delta debugging on the list of lines."""
    n = 2
    while len(lines) >= 2:
        chunk = max(1, len(lines) // n)
        reduced = False
        for i in range(0, len(lines), chunk):
            cand = lines[:i] + lines[i + chunk:]
            if cand and pred(cand):
                lines = cand
                n = max(n - 1, 2)
                reduced = True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(lines), n * 2)
    return lines


def flagstr(flags):
    return " ".join("--%s %s" % (k, v) for k, v in flags.items() if NEUTRAL.get(k) != v and not k.startswith("_")) + \
        "  (+ neutral: --max-entities 0 --entity-ttl 100000h --max-ahead 100000h --dedupe-horizon 100000h)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--config", default=",".join(CONFIGS))
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("-v", action="store_true")
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="difftest-")
    summary = {}
    fails = []
    for cname in a.config.split(","):
        flags = CONFIGS[cname]
        ok = 0
        for seed in range(a.start, a.start + a.seeds):
            lines = gen(seed, flags)
            diff = compare(lines, flags, d)
            if diff is None:
                ok += 1
                if a.v:
                    print("PASS %s seed=%d (%d lines)" % (cname, seed, len(lines)))
                continue
            print("FAIL %s seed=%d (%d lines): %s" % (cname, seed, len(lines), diff.splitlines()[0]))
            fails.append((cname, seed))
            if not a.no_shrink:
                first_kind = diff.splitlines()[0].split(":")[0].split("[")[0]
                pred = lambda c: (lambda r: r is not None and r.splitlines()[0].split(":")[0].split("[")[0] == first_kind)(compare(c, flags, d))
                small = ddmin(lines, pred)
                print("  minimal input (%d lines), flags: %s" % (len(small), flagstr(flags)))
                for l in small:
                    print("    " + l.decode())
                print("  " + compare(small, flags, d).replace("\n", "\n  "))
        summary[cname] = (ok, a.seeds)
    print("\nSUMMARY")
    tot = 0
    for c, (ok, n) in summary.items():
        tot += ok
        print("  %-16s %3d/%d PASS" % (c, ok, n))
    print("  total %d/%d" % (tot, sum(n for _, n in summary.values())))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
