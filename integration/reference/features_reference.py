#!/usr/bin/env python3
"""An independent reference computation of a feature definition's outputs.

It shares no code with the Go implementation: fastavro decodes the input, PyYAML
reads the definition, Python's Decimal converts amounts, and every feature is
computed from the list of counted events by the documented rules
(docs/features.md, docs/feature-outputs.md, docs/contract.md), with no buckets,
rings, heaps, hashes or snapshots. Tests run it on seeded streams and compare
its output, record by record, with what `velocity-consumer replay` and `run`
publish.

    features_reference.py DEFINITION INPUT.avro [--lateness-ms N]
        [--dedupe-horizon-ms N] [--topic T] [--partition P]

INPUT is an Avro object container file written with the definition's input
schema; its records are one partition's offsets 0, 1, 2, ... in file order. It
prints one JSON object per input offset, in offset order:

    {"offset": 7, "dead": "duplicate"}
    {"offset": 8, "features": {...the flat record's fields...},
     "distinct_over_bound": {"merchants": false}}

distinct_over_bound tells, per distinct_count feature, whether the entity's
retained distinct values ever exceeded max_exact up to this event: only then
may the service report an estimate (<feature>_exact false).
"""

import argparse
import datetime
import json
import sys
from decimal import Decimal

import fastavro
import yaml

MIN_EVENT_TIME = 946_684_800_000  # 2000-01-01T00:00:00Z
MAX_AHEAD_MS = 24 * 3600 * 1000
MAX_AMOUNT = 10**15
HISTORY_TTL_MS = 7 * 24 * 3600 * 1000
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def parse_ms(s):
    units = [("ms", 1), ("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)]
    for suffix, mult in units:
        if s.endswith(suffix) and s[: -len(suffix)].isdigit():
            return int(s[: -len(suffix)]) * mult
    raise ValueError("duration " + s)


def ms_name(ms):
    for div, unit in ((3_600_000, "h"), (60_000, "m"), (1000, "s")):
        if ms % div == 0:
            return str(ms // div) + unit
    return str(ms) + "ms"


def floor_div(a, b):
    return a // b  # Python's // floors toward negative infinity


def find_type(schema, path, named):
    """The Avro type (dict or str) at a dot path, unwrapping ["null", T]."""
    t = schema
    for part in path.split("."):
        t = resolve(t, named)
        if isinstance(t, list):
            t = next(x for x in t if x != "null")
            t = resolve(t, named)
        t = next(f["type"] for f in t["fields"] if f["name"] == part)
    t = resolve(t, named)
    if isinstance(t, list):
        t = resolve(next(x for x in t if x != "null"), named)
    return t


def collect_named(schema, named):
    if isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed"):
            named[schema["name"]] = schema
        for f in schema.get("fields", []):
            collect_named(f["type"], named)
        for k in ("items", "values"):
            if k in schema:
                collect_named(schema[k], named)
    elif isinstance(schema, list):
        for s in schema:
            collect_named(s, named)


def resolve(t, named):
    if isinstance(t, str) and t in named:
        return named[t]
    return t


def get_path(rec, path):
    v = rec
    for part in path.split("."):
        if v is None:
            return None
        v = v.get(part)
    return v


def decimal_value(raw, scale):
    """Two's-complement big-endian unscaled integer → exact Decimal."""
    unscaled = int.from_bytes(raw, "big", signed=True)
    return Decimal(unscaled).scaleb(-scale)


class Definition:
    def __init__(self, path):
        with open(path) as f:
            d = yaml.safe_load(f)
        self.label = d.get("version", "")
        inp = d["input"]
        self.paths = {k: inp.get(k) for k in ("event_id", "entity_id", "event_time", "amount")}
        self.exponent = inp.get("amount_exponent")
        self.windows = {}
        self.window_order = []
        for w in d["windows"]:
            wl, bl = w.split(":")
            W, b = parse_ms(wl), parse_ms(bl)
            name = ms_name(W)
            self.windows[name] = (W, b)
            self.window_order.append(name)
        self.features = d["features"]
        for f in self.features:
            f.setdefault("where", [])
            if f["agg"] == "distinct_count":
                f.setdefault("max_exact", 64)


class Reference:
    def __init__(self, definition, schema, lateness, horizon, topic, partition):
        self.d = definition
        self.schema = schema
        self.named = {}
        collect_named(schema, self.named)
        self.lateness = lateness
        self.horizon = horizon
        self.topic = topic
        self.partition = partition
        self.types = {}
        for key, p in definition.paths.items():
            if p:
                self.types[p] = find_type(schema, p, self.named)
        for f in definition.features:
            for pr in f["where"]:
                self.types[pr["field"]] = find_type(schema, pr["field"], self.named)
            if f["agg"] == "distinct_count":
                self.types[f["field"]] = find_type(schema, f["field"], self.named)

    def typed(self, path, raw):
        """A field's value as the rules compare it: Decimal for decimals, str for
        strings and enums, bool, int."""
        if raw is None:
            return None
        t = self.types[path]
        if isinstance(raw, Decimal):
            return raw
        if isinstance(t, dict) and t.get("logicalType") == "decimal":
            return decimal_value(raw, t.get("scale", 0))
        if isinstance(raw, bytes):
            return raw
        return raw

    def decode(self, rec):
        """(event_id, entity, time_ms, amount_minor) or a dead reason.

        docs/features.md: first a mapped field that is null or does not
        convert, in the order event id, entity id, amount, event time; then
        the contract's rules on the values in the same order."""
        p = self.d.paths
        raw = {}
        for key in ("event_id", "entity_id"):
            v = get_path(rec, p[key])
            if v is None:
                return "invalid:" + p[key]
            if isinstance(v, int) and not isinstance(v, bool):
                v = str(v)
            raw[key] = v
        amount = 0
        if p["amount"]:
            v = self.typed(p["amount"], get_path(rec, p["amount"]))
            if v is None:
                return "invalid:" + p["amount"]
            if isinstance(v, Decimal):
                minor = v.scaleb(self.d.exponent)
                if minor != minor.to_integral_value():
                    return "invalid:" + p["amount"]
                amount = int(minor)
            else:
                amount = int(v)
        t = self.types[p["event_time"]]
        ms = get_path(rec, p["event_time"])
        if ms is None:
            return "invalid:" + p["event_time"]
        if isinstance(ms, datetime.datetime):
            # fastavro applied the logical type: back to the long it was written as.
            micros = (ms - EPOCH) // datetime.timedelta(microseconds=1)
            ms = micros if t.get("logicalType") == "timestamp-micros" else micros // 1000
        if isinstance(t, dict) and t.get("logicalType") == "timestamp-micros":
            ms = ms // 1000  # floor
        ids = []
        for key, limit in (("event_id", 128), ("entity_id", 256)):
            v = raw[key]
            if isinstance(v, bytes):
                try:
                    v = v.decode("utf-8")
                except UnicodeDecodeError:
                    return "invalid:" + p[key]
            if v == "" or len(v.encode("utf-8")) > limit:
                return "invalid:" + p[key]
            ids.append(v)
        if amount < 0 or amount > MAX_AMOUNT:
            return "invalid:" + p["amount"]
        return (ids[0], ids[1], ms, amount)

    def matches(self, f, rec):
        for pr in f["where"]:
            v = self.typed(pr["field"], get_path(rec, pr["field"]))
            if "is_null" in pr:
                if (v is None) != bool(pr["is_null"]):
                    return False
                continue
            if v is None:
                return False
            op = next(k for k in ("eq", "ne", "in", "not_in", "lt", "le", "gt", "ge") if k in pr)
            want = pr[op]

            def conv(x):
                if isinstance(v, Decimal):
                    return Decimal(str(x))
                if isinstance(v, bool):
                    return bool(x)
                if isinstance(v, int):
                    return Decimal(str(x)) if not isinstance(x, int) else x
                return str(x)

            if op == "eq" and not v == conv(want):
                return False
            if op == "ne" and not v != conv(want):
                return False
            if op == "in" and v not in [conv(x) for x in want]:
                return False
            if op == "not_in" and v in [conv(x) for x in want]:
                return False
            if op == "lt" and not v < conv(want):
                return False
            if op == "le" and not v <= conv(want):
                return False
            if op == "gt" and not v > conv(want):
                return False
            if op == "ge" and not v >= conv(want):
                return False
        return True

    def run(self, records):
        out = {}
        seen = {}  # event id -> time accepted
        max_seen = None
        counted = []
        for off, rec in enumerate(records):
            r = self.decode(rec)
            if isinstance(r, str):
                out[off] = {"offset": off, "dead": r}
                continue
            eid, ent, ms, amount = r
            if ms < MIN_EVENT_TIME or (max_seen is not None and ms > max_seen + MAX_AHEAD_MS):
                out[off] = {"offset": off, "dead": "invalid:" + self.d.paths["event_time"]}
                continue
            if eid in seen and (max_seen is None or seen[eid] >= max_seen - self.horizon):
                out[off] = {"offset": off, "dead": "duplicate"}
                continue
            if max_seen is not None and ms < max_seen - self.lateness:
                out[off] = {"offset": off, "dead": "late"}
                continue
            seen[eid] = ms
            max_seen = ms if max_seen is None else max(max_seen, ms)
            counted.append((ms, off, eid, ent, amount, rec))
        counted.sort(key=lambda e: (e[0], e[1]))
        history = {}
        over = {}  # (entity, feature) -> a window held more than max_exact values
        for ms, off, eid, ent, amount, rec in counted:
            prev = history.setdefault(ent, [])
            prev.append((ms, amount, rec))
            row = {"event_id": eid, "entity_id": ent, "event_time": ms}
            bound = {}
            for f in self.d.features:
                name = f["name"]
                match = [(t, a, r) for (t, a, r) in prev if self.matches(f, r)]
                largest = max(self.d.windows[w][0] for w in f["windows"])
                for w in f["windows"]:
                    W, b = self.d.windows[w]
                    n = W // b
                    k = floor_div(ms, b)
                    inw = [(t, a, r) for (t, a, r) in match if k - n + 1 <= floor_div(t, b) <= k]
                    col = name + "_" + w
                    agg = f["agg"]
                    if agg == "count":
                        row[col] = len(inw)
                    elif agg == "sum":
                        row[col] = sum(a for _, a, _ in inw)
                    elif agg == "min":
                        row[col] = min((a for _, a, _ in inw), default=None)
                    elif agg == "max":
                        row[col] = max((a for _, a, _ in inw), default=None)
                    elif agg == "distinct_count":
                        vals = {self.hashable(f["field"], r) for _, _, r in inw}
                        vals.discard(None)
                        row[col] = len(vals)
                if f["agg"] == "distinct_count":
                    # Values that any window of the feature still holds.
                    held = set()
                    for t, a, r in match:
                        if ms - t < largest + max(self.d.windows[w][1] for w in f["windows"]):
                            held.add(self.hashable(f["field"], r))
                    held.discard(None)
                    key = (ent, name)
                    over[key] = over.get(key, False) or len(held) > f["max_exact"]
                    bound[name] = over[key]
                    row[name + "_exact"] = None  # checked by the caller against bound
            if len(prev) > 1 and ms - prev[-2][0] <= HISTORY_TTL_MS:
                row["ms_since_previous"] = ms - prev[-2][0]
            else:
                row["ms_since_previous"] = None
            row["late"] = False
            row["source_topic"] = self.topic
            row["source_partition"] = self.partition
            row["source_offset"] = off
            out[off] = {"offset": off, "features": row, "distinct_over_bound": bound}
        return [out[i] for i in sorted(out)]

    def hashable(self, path, rec):
        v = self.typed(path, get_path(rec, path))
        if isinstance(v, Decimal):
            return ("d", v.normalize())
        return v if v is None else (type(v).__name__, v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("definition")
    ap.add_argument("input")
    ap.add_argument("--lateness-ms", type=int, default=0)
    ap.add_argument("--dedupe-horizon-ms", type=int, default=24 * 3600 * 1000)
    ap.add_argument("--topic", default="")
    ap.add_argument("--partition", type=int, default=0)
    a = ap.parse_args()
    d = Definition(a.definition)
    with open(a.input, "rb") as f:
        rd = fastavro.reader(f)
        schema = rd.writer_schema
    with open(a.input, "rb") as f:
        records = list(fastavro.reader(f))
    ref = Reference(d, schema, a.lateness_ms, a.dedupe_horizon_ms, a.topic, a.partition)
    for line in ref.run(records):
        print(json.dumps(line, default=str))


if __name__ == "__main__":
    main()
