#!/usr/bin/env python3
"""An independent reference computation of a feature definition's outputs.

It shares no code with the Go implementation: fastavro decodes the input, PyYAML
reads the definition, Python's Decimal converts amounts, and every feature is
computed from the list of counted events by the documented rules
(docs/features.md, docs/feature-outputs.md, docs/contract.md), with no buckets,
rings, heaps, hashes or snapshots. Tests run it on seeded streams and compare
its output, record by record, with what `velocity-consumer replay` and `run`
publish.

    features_reference.py DEFINITION INPUT.avro [INPUT.avro ...] [--lateness-ms N]
        [--dedupe-horizon-ms N] [--topic T] [--partition P] [--group-out DIR]

Each INPUT is an Avro object container file written with the definition's input
schema; its records are one partition's offsets 0, 1, 2, ... in file order. The
i-th INPUT is partition P + i (P is 0 unless given). For every input offset, in
partition then offset order, it prints one JSON object: its dead letter, or the
in-place group's row (the top-level features, keyed by input.entity_id):

    {"offset": 7, "dead": "duplicate"}
    {"offset": 8, "features": {...the flat record's fields...},
     "distinct_over_bound": {"merchants": false}}

With several INPUTs each object also has "partition": P + i.

distinct_over_bound tells, per distinct_count feature, whether the entity's
retained distinct values ever exceeded max_exact up to this event: only then
may the service report an estimate (<feature>_exact false).

Re-keyed groups (a definition's `groups:`, docs/repartition.md). Every input
partition decides its verdicts alone, as without groups; a key of a re-keyed
group that is present but over 256 bytes (or bytes that are not UTF-8) makes the
whole record a dead letter invalid:<key path>, checked after the event time's
range and before duplicates. Every accepted record (not a dead letter, not a
duplicate, not late at its partition) whose key for group g is not null, absent
or empty is an event of g; g's events from all partitions are applied in
(event time, source partition, source offset) order to g's own windows, filters
and distinct counts, with the entity being g's key, one row per event, whose
source_topic/partition/offset are the input record's. With --group-out DIR it
writes, for each re-keyed group g (none for a definition without groups):

    DIR/<g>.jsonl   one object per event of g, in the order they were applied:
                    {"partition": 1, "offset": 8, "features": {...},
                     "distinct_over_bound": {...}}
    DIR/summary.json  {"in_place": <top-level group name>, "partitions": n,
                    "records": n, "dead": {reason: count},
                    "groups": {name: {"key": path, "in_place": bool,
                               "rows": events, "no_key": accepted records
                               without a key for the group,
                               "distinct": {feature: max_exact}}}}

The in-place group is in summary.json too (in_place true), its rows on stdout.
A record without a key for g has no row for g, and is only counted in no_key.
"""

import argparse
import bisect
import datetime
import json
import os
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


class FeatureSet:
    """One group of features: its name, the path of its key, its own windows and
    features. The in-place group's key is input.entity_id; a re-keyed group's is
    its `key`."""

    def __init__(self, name, key, windows, features):
        self.name = name
        self.key = key
        self.windows = {}
        self.window_order = []
        for w in windows:
            wl, bl = w.split(":")
            W, b = parse_ms(wl), parse_ms(bl)
            wname = ms_name(W)
            self.windows[wname] = (W, b)
            self.window_order.append(wname)
        self.features = features
        for f in self.features:
            f.setdefault("where", [])
            if f["agg"] == "distinct_count":
                f.setdefault("max_exact", 64)
        # No event older than this before the newest one can be in any window's
        # range (the range starts at bucket k - N + 1, after t - W - b).
        self.span = max(W + b for W, b in self.windows.values())

    def paths(self):
        for f in self.features:
            for pr in f["where"]:
                yield pr["field"]
            if f["agg"] == "distinct_count":
                yield f["field"]

    def distinct(self):
        return {f["name"]: f["max_exact"] for f in self.features if f["agg"] == "distinct_count"}


class Definition:
    def __init__(self, path):
        with open(path) as f:
            d = yaml.safe_load(f)
        self.label = d.get("version", "")
        inp = d["input"]
        self.paths = {k: inp.get(k) for k in ("event_id", "entity_id", "event_time", "amount")}
        self.exponent = inp.get("amount_exponent")
        self.top = FeatureSet(d.get("group", "entity"), inp["entity_id"], d["windows"], d["features"])
        self.groups = [FeatureSet(g["name"], g["key"], g["windows"], g["features"]) for g in d.get("groups") or []]


class Reference:
    def __init__(self, definition, schema, lateness, horizon, topic):
        self.d = definition
        self.schema = schema
        self.named = {}
        collect_named(schema, self.named)
        self.lateness = lateness
        self.horizon = horizon
        self.topic = topic
        self.types = {}
        for key, p in definition.paths.items():
            if p:
                self.types[p] = find_type(schema, p, self.named)
        for fs in [definition.top] + definition.groups:
            self.types[fs.key] = find_type(schema, fs.key, self.named)
            for p in fs.paths():
                self.types[p] = find_type(schema, p, self.named)

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

    def group_key(self, g, rec):
        """(key, None) or (None, dead reason) for re-keyed group g.

        groups-design: converted like entity_id; null, absent (a record on the
        path is null) or empty is no key, "" (the record is not an event of g,
        and that is not an error); a key present but over 256 bytes or not
        UTF-8 rejects the whole record as invalid:<key path>."""
        v = get_path(rec, g.key)
        if v is None:
            return "", None
        if isinstance(v, int) and not isinstance(v, bool):
            v = str(v)
        if isinstance(v, bytes):
            try:
                v = v.decode("utf-8")
            except UnicodeDecodeError:
                return None, "invalid:" + g.key
        if v == "":
            return "", None
        if len(v.encode("utf-8")) > 256:
            return None, "invalid:" + g.key
        return v, None

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

    def stage1(self, records, partition):
        """One input partition's verdicts, in offset order.

        Returns (dead, accepted): dead maps an offset to its reason; accepted
        lists the counted records as Accepted tuples, in offset order, each with
        its key for every re-keyed group ("" for none). A record is checked in
        this order: decode and the contract's field rules, the event time's
        range, the re-keyed groups' keys (in definition order), then duplicate,
        then lateness against the partition's newest accepted event time."""
        dead = {}
        accepted = []
        seen = {}  # event id -> time accepted
        max_seen = None
        for off, rec in enumerate(records):
            r = self.decode(rec)
            if isinstance(r, str):
                dead[off] = r
                continue
            eid, ent, ms, amount = r
            if ms < MIN_EVENT_TIME or (max_seen is not None and ms > max_seen + MAX_AHEAD_MS):
                dead[off] = "invalid:" + self.d.paths["event_time"]
                continue
            keys, bad = [], None
            for g in self.d.groups:
                k, bad = self.group_key(g, rec)
                if bad:
                    break
                keys.append(k)
            if bad:
                dead[off] = bad
                continue
            if eid in seen and (max_seen is None or seen[eid] >= max_seen - self.horizon):
                dead[off] = "duplicate"
                continue
            if max_seen is not None and ms < max_seen - self.lateness:
                dead[off] = "late"
                continue
            seen[eid] = ms
            max_seen = ms if max_seen is None else max(max_seen, ms)
            accepted.append((ms, partition, off, eid, ent, amount, rec, keys))
        return dead, accepted

    def rows(self, fs, events):
        """The feature rows of group fs, one per event, keyed by (partition, offset).

        events are (time, partition, offset, event id, entity, amount, record)
        in the order they are applied, which is time order: every event is at or
        after its entity's newest, so each window's range is the buckets
        k - N + 1 .. k of the event's own bucket k."""
        out = {}
        history = {}  # entity -> [(time, amount, record, match per feature, value per feature)]
        times = {}  # entity -> [time], for the bisect below
        over = {}  # (entity, feature) -> a window held more than max_exact values
        for ms, part, off, eid, ent, amount, rec in events:
            prev = history.setdefault(ent, [])
            tl = times.setdefault(ent, [])
            match = [self.matches(f, rec) for f in fs.features]
            vals = [self.hashable(f["field"], rec) if f["agg"] == "distinct_count" else None for f in fs.features]
            prev.append((ms, amount, rec, match, vals))
            tl.append(ms)
            # Events at or before ms - span are in no window's range (a range
            # starts at bucket k - N + 1, after ms - W) and no longer held for
            # distinct_over_bound, so they are skipped without changing a value.
            recent = prev[bisect.bisect_right(tl, ms - fs.span):]
            row = {"event_id": eid, "entity_id": ent, "event_time": ms}
            bound = {}
            for fi, f in enumerate(fs.features):
                name = f["name"]
                m = [(t, a, v[fi]) for (t, a, _, mt, v) in recent if mt[fi]]
                largest = max(fs.windows[w][0] for w in f["windows"])
                for w in f["windows"]:
                    W, b = fs.windows[w]
                    n = W // b
                    k = floor_div(ms, b)
                    inw = [(t, a, v) for (t, a, v) in m if k - n + 1 <= floor_div(t, b) <= k]
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
                        dv = {v for _, _, v in inw}
                        dv.discard(None)
                        row[col] = len(dv)
                if f["agg"] == "distinct_count":
                    # Values that any window of the feature still holds.
                    held = set()
                    for t, a, v in m:
                        if ms - t < largest + max(fs.windows[w][1] for w in f["windows"]):
                            held.add(v)
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
            row["source_partition"] = part
            row["source_offset"] = off
            out[(part, off)] = {"partition": part, "offset": off, "features": row, "distinct_over_bound": bound}
        return out

    def hashable(self, path, rec):
        v = self.typed(path, get_path(rec, path))
        if isinstance(v, Decimal):
            return ("d", v.normalize())
        return v if v is None else (type(v).__name__, v)


def read_input(path):
    with open(path, "rb") as f:
        rd = fastavro.reader(f)
        return rd.writer_schema, list(rd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("definition")
    ap.add_argument("inputs", nargs="+", metavar="input")
    ap.add_argument("--lateness-ms", type=int, default=0)
    ap.add_argument("--dedupe-horizon-ms", type=int, default=24 * 3600 * 1000)
    ap.add_argument("--topic", default="")
    ap.add_argument("--partition", type=int, default=0)
    ap.add_argument("--group-out")
    a = ap.parse_args()
    d = Definition(a.definition)
    schema, parts = None, []
    for path in a.inputs:
        s, records = read_input(path)
        if schema is None:
            schema = s
        elif s != schema:
            sys.exit(path + ": another writer schema than " + a.inputs[0] + "'s")
        parts.append(records)
    ref = Reference(d, schema, a.lateness_ms, a.dedupe_horizon_ms, a.topic)
    several = len(parts) > 1
    accepted_all = []
    dead_count = {}
    for i, records in enumerate(parts):
        part = a.partition + i
        dead, accepted = ref.stage1(records, part)
        accepted_all.extend(accepted)
        for r in dead.values():
            dead_count[r] = dead_count.get(r, 0) + 1
        # In place: a partition's own events, released in (time, offset) order.
        evs = sorted(accepted, key=lambda e: (e[0], e[2]))
        rows = ref.rows(d.top, [e[:7] for e in evs])
        for off in range(len(records)):
            if off in dead:
                line = {"offset": off, "dead": dead[off]}
            else:
                line = rows[(part, off)]
                del line["partition"]
            if several:
                line = {"partition": part, **line}
            print(json.dumps(line, default=str))
    if not a.group_out:
        return
    os.makedirs(a.group_out, exist_ok=True)
    summary = {
        "in_place": d.top.name,
        "partitions": len(parts),
        "records": sum(len(r) for r in parts),
        "dead": dead_count,
        "groups": {d.top.name: {"key": d.top.key, "in_place": True, "rows": len(accepted_all), "no_key": 0, "distinct": d.top.distinct()}},
    }
    for gi, g in enumerate(d.groups):
        # Every accepted record with a key for g is an event of g, applied in
        # (event time, source partition, source offset) order.
        evs = [(e[0], e[1], e[2], e[3], e[7][gi], e[5], e[6]) for e in accepted_all if e[7][gi] != ""]
        evs.sort(key=lambda e: (e[0], e[1], e[2]))
        rows = ref.rows(g, evs)
        with open(os.path.join(a.group_out, g.name + ".jsonl"), "w") as f:
            for e in evs:
                f.write(json.dumps(rows[(e[1], e[2])], default=str) + "\n")
        summary["groups"][g.name] = {"key": g.key, "in_place": False, "rows": len(evs), "no_key": len(accepted_all) - len(evs), "distinct": g.distinct()}
    with open(os.path.join(a.group_out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
