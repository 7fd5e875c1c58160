#!/usr/bin/env python3
"""Decode VelocityFeatures records that kcat hands over on stdin.

The features topic holds plain (schemaless) Avro by default: no container
header and no schema id, just the record, so a reader needs the schema
(schemas/velocity_features.avsc) and a length for each value. kcat gives both
with -f '%R%s': each value's length as a 32-bit big-endian integer, then its
bytes.

    kcat -b localhost:9092 -C -t velocity-features -o beginning -e -f '%R%s' \\
        | python3 examples/read_features.py

Prints one JSON object per record. Needs fastavro (python3 -m pip install
fastavro). With --schema-registry the values are in the Confluent wire format
instead (a zero byte and a 4-byte schema id before the Avro); pass --confluent
to skip those 5 bytes.
"""
import io
import json
import os
import signal
import struct
import sys

import fastavro

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "schemas", "velocity_features.avsc")) as f:
    schema = fastavro.parse_schema(json.load(f))

signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # quiet when piped into head
skip = 5 if "--confluent" in sys.argv[1:] else 0
data = sys.stdin.buffer
count = 0
while True:
    head = data.read(4)
    if not head:
        break
    if len(head) < 4:
        sys.exit("read_features.py: input ends inside a length prefix (use kcat -f '%R%s')")
    (n,) = struct.unpack(">i", head)
    if n < 0:  # a null value: the features topic has none, but say so
        print(json.dumps(None))
        continue
    value = data.read(n)
    if len(value) < n:
        sys.exit("read_features.py: input ends inside a record")
    rec = fastavro.schemaless_reader(io.BytesIO(value[skip:]), schema)
    print(json.dumps(rec, default=str))
    count += 1
print(f"{count} features records", file=sys.stderr)
