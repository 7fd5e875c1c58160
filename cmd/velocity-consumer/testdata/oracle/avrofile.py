"""minimal Avro object container writer for Transaction records (stdlib only)"""
import json, os
SCHEMA = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), *[".."] * 4, "schemas", "transaction.avsc")).read()
def zz(v):
    z = ((v << 1) ^ (v >> 63)) & ((1 << 64) - 1)
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7f) | 0x80); z >>= 7
    out.append(z); return bytes(out)
def s(b):
    if isinstance(b, str): b = b.encode('utf-8', 'surrogatepass')
    return zz(len(b)) + b
def record(eid, ent, amt, cur, t):
    return s(eid) + s(ent) + zz(amt) + s(cur) + zz(t)
def write(path, recs):
    sync = os.urandom(16)
    meta = {b'avro.schema': SCHEMA.encode(), b'avro.codec': b'null'}
    hdr = b'Obj\x01' + zz(len(meta)) + b''.join(s(k) + s(v) for k, v in meta.items()) + zz(0) + sync
    data = b''.join(recs)
    with open(path, 'wb') as f:
        f.write(hdr + zz(len(recs)) + zz(len(data)) + data + sync)
