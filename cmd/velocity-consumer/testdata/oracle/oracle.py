#!/usr/bin/env python3
"""Independent reference implementation of velocity-consumer semantics
(docs/contract.md: the rules and the worked example), for JSON-lines replay of one
partition. Stdlib only.

Interpretation choices (flagged in the report where the spec is silent):
  * validation order: event_id, entity_id, amount_minor, currency, event_time
    (schema field order); event_time covers --min-event-time and --max-ahead.
  * late=apply: an entity's ring for window (W:b) holds buckets
    head-N+1 .. head, head = floor(max counted event_time of entity / b).
    A late event is counted iff floor(t/b) >= head-N+1 in every window; else DLQ late.
    Its own aggregates are whole buckets max(k-N+1, head'-N+1) .. k (head' after
    counting it), i.e. they include same-bucket events that happened after it.
  * ms_since_previous = t - time of the entity's previous counted event in
    release order (a late-applied event is "released" when it arrives).
  * dedupe horizon: an accepted id is remembered while its event_time >=
    maxT - horizon (maxT = newest accepted event time).

Two rules that the first statement of the contract left out, and docs/contract.md now states:
  * late=apply also requires the late event to be at most the largest window
    behind the watermark (idle entities are swept that far behind it).
  * ms_since_previous is null when the entity's previous counted event is more
    than --entity-ttl before this one.
Nothing else of the product's internals (sweeps, eviction timing) is modelled:
with these rules they must never change an output.
"""
import base64
import bisect
import json
import re
import sys
from datetime import datetime, timezone

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "ms": 1, "s": 1000, "m": 60000,
          "h": 3600000, "d": 86400000}


def parse_duration_ms(s):
    s = s.strip()
    if s in ("0", ""):
        return 0
    neg = s.startswith("-")
    if neg:
        s = s[1:]
    total = 0.0
    pos = 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)", s):
        if m.start() != pos:
            raise ValueError("bad duration " + s)
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s):
        raise ValueError("bad duration " + s)
    v = int(round(total))
    return -v if neg else v


def window_name(ms):
    for unit, d in (("h", 3600000), ("m", 60000), ("s", 1000)):
        if ms % d == 0:
            return "%d%s" % (ms // d, unit)
    return "%dms" % ms


class Window:
    def __init__(self, spec):
        w, b = spec.split(":")
        self.W = parse_duration_ms(w)
        self.b = parse_duration_ms(b)
        assert self.W > 0 and self.b > 0 and self.W % self.b == 0
        self.N = self.W // self.b
        self.name = window_name(self.W)


class Config:
    def __init__(self, windows="1m:1s,5m:5s,1h:1m,24h:1h", allowed_lateness="1s",
                 late="dlq", max_ahead="24h", min_event_time="2000-01-01T00:00:00Z",
                 dedupe_horizon="24h", max_record_bytes=1048576, topic="in.jsonl",
                 size_mode="avro", entity_ttl="100000h"):
        self.entity_ttl = parse_duration_ms(entity_ttl)
        # size_mode: "avro" = a JSON line's size is that of its Avro re-encoding,
        # checked after decode (observed product behaviour; README: "input values
        # larger than this"); "line" = the raw line bytes, checked first.
        self.size_mode = size_mode
        self.windows = [Window(s) for s in windows.split(",")]
        self.L = parse_duration_ms(allowed_lateness)
        self.late = late
        self.max_ahead = parse_duration_ms(max_ahead)
        dt = datetime.strptime(min_event_time.replace("Z", "+00:00"), "%Y-%m-%dT%H:%M:%S%z")
        self.min_event_time = int(dt.astimezone(timezone.utc).timestamp()) * 1000
        self.horizon = parse_duration_ms(dedupe_horizon)
        self.max_record_bytes = int(max_record_bytes)
        self.topic = topic


class Entity:
    __slots__ = ("events", "last_release_t", "max_t")

    def __init__(self):
        self.events = []          # counted events: list of (t, amount), unsorted ok
        self.last_release_t = None
        self.max_t = None         # max counted event_time


def raw_bytes(s):
    """The bytes the product holds for a decoded JSON string: a line is read
    with surrogateescape, so a raw byte that is not UTF-8 comes back as
    itself; a lone surrogate from a \\u escape has no such byte and is
    written in its three-byte form, as the product does. (A \\udc80-\\udcff
    escape is taken for a raw byte: the streams never hold one.)"""
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass")


def _zz_len(v):
    z = (v << 1) ^ (v >> 63)
    z &= (1 << 64) - 1
    n = 1
    while z >= 0x80:
        z >>= 7
        n += 1
    return n


def avro_size(tx):
    """length of the plain Avro binary encoding of a Transaction"""
    n = 0
    for f in ("event_id", "entity_id"):
        b = len(raw_bytes(tx[f]))
        n += _zz_len(b) + b
    n += _zz_len(tx["amount_minor"])
    b = len(raw_bytes(tx["currency"]))
    n += _zz_len(b) + b
    n += _zz_len(tx["event_time"])
    return n


def b64(b):
    return base64.b64encode(b).decode()


class Partition:
    def __init__(self, cfg):
        self.cfg = cfg
        self.maxT = None
        self.pending = []          # sorted list of (t, offset, tx)
        self.ids = {}              # event_id -> event_time of accepted event
        self.entities = {}
        self.features = []
        self.dlq = []
        self.offset = 0

    # ---- helpers -------------------------------------------------------
    @property
    def wm(self):
        return None if self.maxT is None else self.maxT - self.cfg.L

    def _dead(self, off, reason, key, value):
        self.dlq.append({"reason": reason, "source_offset": off,
                         "key": None if key is None else b64(key),
                         "value": b64(value)})

    def _decode(self, raw):
        try:
            obj = json.loads(raw.decode("utf-8", "surrogateescape"))
        except Exception:
            return None
        if not isinstance(obj, dict):
            return None
        tx = {}
        # JSON-lines mapping (docs/backtesting.md, "Files as input"): a missing or null
        # string field reads as "" (then validated); numbers must be JSON integers.
        for f in ("event_id", "entity_id", "currency"):
            v = obj.get(f)
            if v is None:
                v = ""
            if not isinstance(v, str):
                return None
            tx[f] = v
        for f in ("amount_minor", "event_time"):
            v = obj.get(f)
            if isinstance(v, bool) or not isinstance(v, int) or not (INT64_MIN <= v <= INT64_MAX):
                return None
            tx[f] = v
        return tx

    @staticmethod
    def _utf8_ok(s):
        try:
            s.encode("utf-8")
            return True
        except UnicodeEncodeError:
            return False

    def _validate(self, tx):
        # strings must be UTF-8 (schema: "1..128 bytes of UTF-8"); the Avro input
        # path dead-letters invalid UTF-8 as invalid:<field>, so JSON lines should too.
        eid = raw_bytes(tx["event_id"])
        if not (1 <= len(eid) <= 128) or not self._utf8_ok(tx["event_id"]):
            return "invalid:event_id"
        ent = raw_bytes(tx["entity_id"])
        if not (1 <= len(ent) <= 256) or not self._utf8_ok(tx["entity_id"]):
            return "invalid:entity_id"
        if not (0 <= tx["amount_minor"] <= 10 ** 15):
            return "invalid:amount_minor"
        c = tx["currency"]
        if not (c == "" or re.fullmatch(r"[A-Z]{3}", c)):
            return "invalid:currency"
        t = tx["event_time"]
        if t < self.cfg.min_event_time:
            return "invalid:event_time"
        if self.maxT is not None and t - self.maxT > self.cfg.max_ahead:
            return "invalid:event_time"
        return None

    def _is_dup(self, eid):
        if eid not in self.ids:
            return False
        te = self.ids[eid]
        if self.maxT is not None and te < self.maxT - self.cfg.horizon:
            return False
        return True

    def _aggregates(self, ent, t, late):
        out = []
        for w in self.cfg.windows:
            k = t // w.b
            lo = k - w.N + 1
            if late:
                head = ent.max_t // w.b
                lo = max(lo, head - w.N + 1)
            cnt = s = 0
            mn = mx = None
            for (et, a) in ent.events:
                kb = et // w.b
                if lo <= kb <= k:
                    cnt += 1
                    s += a
                    mn = a if mn is None else min(mn, a)
                    mx = a if mx is None else max(mx, a)
            out.append({"window": w.name, "window_ms": w.W, "bucket_ms": w.b, "count": cnt,
                        "sum_minor": s, "min_minor": mn, "max_minor": mx})
        return out

    def _count(self, t, off, tx, late):
        ent = self.entities.get(tx["entity_id"])
        if ent is None:
            ent = self.entities[tx["entity_id"]] = Entity()
        # README: "an overflow is a dead letter, never a wrap" (reason observed:
        # invalid:amount_minor, emitted when the event would be counted).
        saved = (list(ent.events), ent.max_t)
        ent.events.append((t, tx["amount_minor"]))
        ent.max_t = t if ent.max_t is None else max(ent.max_t, t)
        aggs = self._aggregates(ent, t, late)
        if any(a["sum_minor"] > INT64_MAX for a in aggs):
            ent.events, ent.max_t = saved
            self._dead(off, "invalid:amount_minor", raw_bytes(tx["entity_id"]),
                       tx["_raw"])
            return
        msp = None if ent.last_release_t is None or t - ent.last_release_t > self.cfg.entity_ttl else t - ent.last_release_t
        ent.last_release_t = t
        self.features.append({
            "event_id": tx["event_id"], "entity_id": tx["entity_id"], "event_time": t,
            "windows": aggs, "ms_since_previous": msp,
            "late": late, "source_topic": self.cfg.topic, "source_partition": 0,
            "source_offset": off})

    def _retained(self, tx):
        ent = self.entities.get(tx["entity_id"])
        if ent is None or ent.max_t is None:
            return True
        t = tx["event_time"]
        for w in self.cfg.windows:
            if t // w.b < ent.max_t // w.b - w.N + 1:
                return False
        return True

    def _release(self, upto=None):
        while self.pending and (upto is None or self.pending[0][0] <= upto):
            t, off, tx = self.pending.pop(0)
            self._count(t, off, tx, False)

    # ---- API -----------------------------------------------------------
    def process(self, raw):
        """raw: one line's bytes without the newline (blank lines must be skipped by caller)."""
        off = self.offset
        self.offset += 1
        if self.cfg.size_mode == "line" and len(raw) > self.cfg.max_record_bytes:
            self._dead(off, "too_large", None, raw)
            return
        tx = self._decode(raw)
        if tx is None:
            self._dead(off, "decode", None, raw)
            return
        tx["_raw"] = raw
        key = raw_bytes(tx["entity_id"])
        if self.cfg.size_mode == "avro" and avro_size(tx) > self.cfg.max_record_bytes:
            self._dead(off, "too_large", key, raw)
            return
        r = self._validate(tx)
        if r:
            self._dead(off, r, key, raw)
            return
        if self._is_dup(tx["event_id"]):
            self._dead(off, "duplicate", key, raw)
            return
        t = tx["event_time"]
        wm = self.wm
        if wm is not None and t < wm:
            H = max(w.W for w in self.cfg.windows)
            if self.cfg.late == "apply" and wm - t <= H and self._retained(tx):
                self.ids[tx["event_id"]] = t
                self._count(t, off, tx, True)
            else:
                self._dead(off, "late", key, raw)
            return
        self.ids[tx["event_id"]] = t
        self.maxT = t if self.maxT is None else max(self.maxT, t)
        bisect.insort(self.pending, (t, off, tx), key=lambda x: (x[0], x[1]))
        self._release(self.wm)

    def finish(self):
        self._release(None)


def run(lines, cfg):
    """lines: list of bytes (file content split on b'\\n'); blank lines skipped."""
    p = Partition(cfg)
    for raw in lines:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if raw.strip() == b"":
            continue
        p.process(raw)
    p.finish()
    return p.features, p.dlq


def main():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--input-file", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--dlq")
    ap.add_argument("--windows", default="1m:1s,5m:5s,1h:1m,24h:1h")
    ap.add_argument("--allowed-lateness", default="1s")
    ap.add_argument("--late", default="dlq")
    ap.add_argument("--max-ahead", default="24h")
    ap.add_argument("--min-event-time", default="2000-01-01T00:00:00Z")
    ap.add_argument("--dedupe-horizon", default="24h")
    ap.add_argument("--max-record-bytes", default=1048576, type=int)
    a, _ = ap.parse_known_args()
    import os
    cfg = Config(a.windows, a.allowed_lateness, a.late, a.max_ahead, a.min_event_time,
                 a.dedupe_horizon, a.max_record_bytes, os.path.basename(a.input_file))
    data = open(a.input_file, "rb").read()
    feats, dlq = run(data.split(b"\n"), cfg)
    with open(a.output, "w") as f:
        for r in feats:
            f.write(json.dumps(r, separators=(",", ":"), ensure_ascii=False) + "\n")
    if a.dlq:
        with open(a.dlq, "w") as f:
            for r in dlq:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
