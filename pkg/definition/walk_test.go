package definition

import (
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// smallSchema has one field of each shape the walker skips, after the mapped
// fields, so that each case below damages exactly one of them.
const smallSchema = `{"type":"record","name":"S","namespace":"w","fields":[
 {"name":"eid","type":"string"},{"name":"key","type":"string"},{"name":"t","type":"long"},
 {"name":"m","type":{"type":"map","values":"long"}},
 {"name":"b","type":"boolean"},
 {"name":"e","type":{"type":"enum","name":"E","symbols":["A","B"]}},
 {"name":"u","type":["null","int"]},
 {"name":"a","type":{"type":"array","items":"int"}},
 {"name":"next","type":["null","S"]}
]}`

const smallDef = `input: {event_id: eid, entity_id: key, event_time: t}
windows: [1m:1s]
features: [{name: n, agg: count, windows: [1m]}]
`

func zz(v int64) []byte { return appendLong(nil, v) }

func appendLong(dst []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		dst = append(dst, byte(u)|0x80)
		u >>= 7
	}
	return append(dst, byte(u))
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func str(s string) []byte { return cat(zz(int64(len(s))), []byte(s)) }

func mapOf(keys ...string) []byte {
	if len(keys) == 0 {
		return []byte{0}
	}
	out := zz(int64(len(keys)))
	for _, k := range keys {
		out = cat(out, str(k), zz(1))
	}
	return append(out, 0)
}

func TestWalkerSkipsAsGoavroChecks(t *testing.T) {
	d := mustParse(t, "s.yaml", smallDef)
	c := mustCompile(t, d, smallSchema)
	ref := newRef(d, smallSchema)
	head := cat(str("e1"), str("k1"), zz(1_700_000_000_000))
	tail := cat([]byte{1}, zz(1), zz(1), zz(5), zz(1), zz(3), zz(0), zz(0)) // b, e, u, a=[3], next=null
	many := make([]string, 40)
	for i := range many {
		many[i] = "k" + strings.Repeat("x", i)
	}
	cases := []struct {
		name  string
		value []byte
		want  string // "" accepts; else the reason's detail must contain it
	}{
		{"good", cat(head, mapOf("a", "b"), tail), ""},
		{"empty map", cat(head, mapOf(), tail), ""},
		{"40 keys", cat(head, mapOf(many...), tail), ""},
		{"duplicate key", cat(head, mapOf("a", "b", "a"), tail), "m: map has a duplicate key"},
		{"duplicate key beyond 16", cat(head, mapOf(append(many, many[3])...), tail), "m: map has a duplicate key"},
		{"duplicate across blocks", cat(head, zz(1), str("a"), zz(1), zz(1), str("a"), zz(1), zz(0), tail), "map has a duplicate key"},
		{"negative block count with size", cat(head, zz(-2), zz(6), str("a"), zz(1), str("b"), zz(1), zz(0), tail), ""},
		{"block count over the limit", cat(head, zz(1<<20+1), tail), "m: array or map block count out of range"},
		{"bad boolean", cat(head, mapOf(), []byte{2}, tail[1:]), "b: boolean byte is neither 0 nor 1"},
		{"enum index", cat(head, mapOf(), []byte{1}, zz(2), tail[2:]), "e: enum index out of range"},
		{"negative enum index", cat(head, mapOf(), []byte{1}, zz(-1), tail[2:]), "e: enum index out of range"},
		{"union index", cat(head, mapOf(), []byte{1}, zz(1), zz(2), zz(1), zz(0), zz(0)), "u: union branch index out of range"},
		{"int overflow", cat(head, mapOf(), []byte{1}, zz(1), zz(1), zz(1<<31), zz(0), zz(0)), "u: int value overflows 32 bits"},
		{"array of ints", cat(head, mapOf(), []byte{1}, zz(1), zz(0), zz(2), zz(-5), zz(7), zz(0), zz(0)), ""},
		{"truncated", cat(head, mapOf(), []byte{1}), "e: truncated"},
		{"trailing", cat(head, mapOf(), tail, []byte{0}), "1 trailing bytes after the record"},
		{"recursive", cat(head, mapOf(), tail[:len(tail)-1], zz(1), head, mapOf(), tail), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rej := checkSame(t, c.Decoder(), ref, tc.value, 0, false)
			switch {
			case tc.want == "" && rej != nil:
				t.Fatalf("rejected: %v", rej)
			case tc.want != "" && (rej == nil || rej.Reason != codec.ReasonDecode || !strings.Contains(rej.Detail, tc.want)):
				t.Fatalf("got %v, want a decode rejection containing %q", rej, tc.want)
			}
		})
	}
	// Nesting beyond maxDepth is refused (goavro would recurse on): the one
	// place, with overflowing varints and ints, where the walker is stricter.
	deep := cat(head, mapOf(), tail[:len(tail)-1])
	for i := 0; i < maxDepth+1; i++ {
		deep = cat(deep, zz(1), head, mapOf(), tail[:len(tail)-1])
	}
	deep = append(deep, 0)
	var tx codec.Transaction
	if rej := c.Decoder().Decode(deep, 0, false, &tx); rej == nil || !strings.Contains(rej.Detail, "nesting deeper than 256") {
		t.Fatalf("deep nesting: %v", rej)
	}
}

// A record of more than 16 map keys allocates to check them; fewer do not.
func TestMapKeysAllocation(t *testing.T) {
	d := mustParse(t, "s.yaml", smallDef)
	c := mustCompile(t, d, smallSchema)
	head := cat(str("e1"), str("k1"), zz(1_700_000_000_000))
	tail := cat([]byte{1}, zz(1), zz(1), zz(5), zz(1), zz(3), zz(0), zz(0))
	v := cat(head, mapOf("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p"), tail)
	var tx codec.Transaction
	if n := testing.AllocsPerRun(100, func() { c.Decoder().Decode(v, 0, false, &tx) }); n > 2 {
		t.Fatalf("%v allocations with 16 map keys, want the 2 id strings", n)
	}
}
