#!/usr/bin/env python3
"""Hand-written edge cases, run through product and oracle (difftest.compare),
plus the worked example of docs/contract.md checked against hand-coded expectations."""
import json, os, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import difftest, oracle
T = difftest.T2026


def tx(eid, ent, amt, t, cur="", **extra):
    d = {"event_id": eid, "entity_id": ent, "amount_minor": amt, "currency": cur, "event_time": t}
    d.update(extra)
    return json.dumps(d, ensure_ascii=False).encode()


def flags(**kw):
    return difftest.C("x", **kw)[1]


CASES = []
def case(name, fl, lines):
    CASES.append((name, fl, lines))

EX = [("e1","card-A",1000,0),("e2","card-A",2500,400),("e3","card-B",700,900),("e4","card-A",300,1500),
      ("e5","card-A",5000,3200),("e6","card-A",100,1900),("e7","card-B",900,600),("e2","card-A",2500,400),
      ("e9","",10,3300),("e10","card-A",40,3200),("e11","card-A",60,11000),("e12","card-B",80,75000)]
exfl = flags(windows="10s:1s,1m:10s", allowed_lateness="2s")
case("examples_md", exfl, [tx(e, n, a, T + t, "EUR") for e, n, a, t in EX])
# the worked example of docs/contract.md: offset -> (10s c/s/min/max, 1m ..., msp) or reason
EXPECT = {0: ((1,1000,1000,1000),(1,1000,1000,1000),None), 1: ((2,3500,1000,2500),(2,3500,1000,2500),400),
          2: ((1,700,700,700),(1,700,700,700),None), 3: ((3,3800,300,2500),(3,3800,300,2500),1100),
          4: ((5,8900,100,5000),(5,8900,100,5000),1300), 5: ((4,3900,100,2500),(4,3900,100,2500),400),
          6: "late", 7: "duplicate", 8: "invalid:entity_id",
          9: ((6,8940,40,5000),(6,8940,40,5000),0), 10: ((3,5100,40,5000),(7,9000,40,5000),7800),
          11: ((1,80,80,80),(1,80,80,80),74100)}
base = flags(windows="10s:1s", allowed_lateness="2s")
case("lengths_bytes_vs_chars", base, [
    tx("a" * 128, "x" * 256, 1, T), tx("a" * 129, "k", 1, T), tx("é" * 64, "é" * 128, 1, T),
    tx("é" * 65, "k", 1, T), tx("e5", "é" * 129, 1, T), tx("😀" * 32, "😀" * 64, 1, T),
    tx("😀" * 33, "k", 1, T), tx("e8", "😀" * 65, 1, T), tx("", "k", 1, T), tx("e10", "", 1, T)])
case("amount_limits", base, [tx("a1", "k", 10**15, T), tx("a2", "k", 10**15 + 1, T), tx("a3", "k", -1, T),
                             tx("a4", "k", 0, T), tx("a5", "k", 10**15, T)])
case("watermark_exact", base, [tx("w1", "k", 1, T + 10000), tx("w2", "k", 2, T + 8000), tx("w3", "k", 3, T + 7999),
                               tx("w4", "j", 4, T + 8000), tx("w5", "k", 5, T + 10000)])
case("ties_offset_order", base, [tx("t%d" % i, "k", i, T + 5000) for i in range(5)] + [tx("z", "k", 9, T + 9000)])
case("bucket_boundaries", flags(windows="3s:1s,7s:7s", allowed_lateness="0s"),
     [tx("b%d" % i, "k", i, T + t) for i, t in enumerate([0, 999, 1000, 2999, 3000, 3999, 6999, 7000, 13999, 14000])])
case("dup_of_pending_and_rejected", base, [
    tx("p1", "k", 1, T + 5000), tx("p1", "k", 1, T + 5000), tx("l1", "k", 1, T), tx("l1", "k", 2, T + 5000),
    tx("i1", "", 1, T + 5000), tx("i1", "k", 3, T + 5001), tx("d1", "k", 1, T + 5002), tx("d1", "k", 1, T + 1)])
case("gap_longer_than_windows", flags(windows="10s:1s,1m:10s", allowed_lateness="1s"), [
    tx("g1", "k", 1, T), tx("g2", "k", 2, T + 3600_000), tx("g3", "k", 3, T + 3600_000 + 60_000),
    tx("g4", "k", 4, T + 3600_000 + 60_000 + 59_999)])
case("max_ahead_boundary", flags(windows="10s:1s", allowed_lateness="2s", max_ahead="20s"), [
    tx("m1", "k", 1, T), tx("m2", "k", 1, T + 20001), tx("m3", "k", 1, T + 20000), tx("m4", "k", 1, T + 40001),
    tx("m3", "k", 1, T + 60001)])
case("min_event_time_boundary", flags(windows="10s:1s", allowed_lateness="2s", min_event_time="2026-11-01T00:00:00Z"),
     [tx("n1", "k", 1, T - 1), tx("n2", "k", 1, T), tx("n1", "k", 1, T + 1)])
case("dedupe_horizon_boundary", flags(windows="10s:1s", allowed_lateness="2s", dedupe_horizon="30s"), [
    tx("h1", "k", 1, T), tx("h2", "k", 1, T + 1), tx("y", "j", 1, T + 30000), tx("h1", "k", 1, T + 30000),
    tx("h2", "k", 1, T + 30000), tx("y2", "j", 1, T + 30002), tx("h2", "k", 1, T + 30002)])
case("too_large_boundary", flags(windows="10s:1s", allowed_lateness="2s", max_record_bytes="30"), [
    tx("a" * n, "k", 1, T) for n in range(10, 20)] + [b"x" * 100])
case("negative_times_floor", flags(windows="3s:1s,7s:7s", allowed_lateness="0s", min_event_time="1969-12-31T00:00:00Z"),
     [tx("n%d" % i, "k", 1, t) for i, t in enumerate([-7001, -7000, -6999, -1001, -1000, -999, -1, 0, 1, 999, 1000])])
case("overflow", flags(windows="1m:1s,10s:1s", allowed_lateness="0s"),
     [tx("o%d" % i, "X", 10**15, T + i) for i in range(9226)] + [tx("z", "X", 0, T + 9300)])
case("blank_and_crlf", base, [tx("c1", "k", 1, T), b"", b"   ", b"\t", tx("c2", "k", 1, T + 1) + b"\r", tx("c3", "k", 1, T + 2)])
case("late_apply_same_bucket_after", flags(windows="10s:1s,1m:10s", allowed_lateness="2s", late="apply"), [
    tx("a1", "k", 1, T + 1500), tx("a2", "k", 2, T + 5000), tx("a3", "k", 3, T + 1200), tx("a4", "k", 4, T + 5001)])
case("late_apply_not_retained", flags(windows="10s:1s,1m:10s", allowed_lateness="2s", late="apply"), [
    tx("a1", "k", 1, T + 20000), tx("a2", "k", 2, T + 25000), tx("a3", "k", 3, T + 10000), tx("a4", "k", 4, T + 10999),
    tx("a3", "k", 3, T + 25000)])


def main():
    d = tempfile.mkdtemp(prefix="cases-")
    bad = 0
    for name, fl, lines in CASES:
        r = difftest.compare(lines, fl, d)
        print("%-32s %s" % (name, "PASS" if r is None else "FAIL\n  " + r.replace("\n", "\n  ")))
        bad += r is not None
    # the contract's worked example, independently of the oracle
    name, fl, lines = CASES[0]
    pf, pd, _ = difftest.run_product(lines, fl, d)
    got = {}
    for r in pf:
        got[r["source_offset"]] = (tuple(tuple(w[k] for k in ("count", "sum_minor", "min_minor", "max_minor")) for w in r["windows"])
                                   + (r["ms_since_previous"],))
    for r in pd:
        got[r["source_offset"]] = r["reason"]
    ok = got == EXPECT and [r["source_offset"] for r in pf] == [0, 1, 2, 3, 5, 4, 9, 10, 11]
    print("%-32s %s" % ("examples_md_table_vs_product", "PASS" if ok else "FAIL %s" % got))
    bad += not ok
    of, od = difftest.run_oracle(lines, fl)
    ok = [r["source_offset"] for r in of] == [0, 1, 2, 3, 5, 4, 9, 10, 11]
    print("%-32s %s" % ("examples_md_table_vs_oracle", "PASS" if ok else "FAIL"))
    bad += not ok
    return bad


case("multi_invalid_order", flags(windows="10s:1s", allowed_lateness="2s", min_event_time="2026-11-01T00:00:00Z"), [
    tx("ok", "k", 1, T + 100000),
    tx("", "", -1, T - 1, "eur"), tx("e2", "", -1, T - 1, "eur"), tx("e3", "k", -1, T - 1, "eur"),
    tx("e4", "k", 1, T - 1, "eur"), tx("e5", "k", 1, T - 1), tx("ok", "", 1, T + 100000),
    tx("ok", "k", 1, T - 1), tx("ok", "k", 1, T + 100000, "usd"), tx("ok", "k", 1, T + 100000)])

case("invalid_utf8_jsonl", base, [
    b'{"event_id":"b\xff","entity_id":"k","amount_minor":1,"currency":"","event_time":%d}' % T,
    b'{"event_id":"b\xfe","entity_id":"k","amount_minor":1,"currency":"","event_time":%d}' % T,
    b'{"event_id":"a\\ud800","entity_id":"k","amount_minor":1,"currency":"","event_time":%d}' % T,
    b'{"event_id":"c","entity_id":"k\xff","amount_minor":1,"currency":"","event_time":%d}' % T,
    b'{"event_id":"d","entity_id":"k\xef\xbf\xbd","amount_minor":1,"currency":"","event_time":%d}' % T])


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
