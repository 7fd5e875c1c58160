package definition

import (
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// BenchmarkDecodeExample is the per-record cost of the example definition (8
// features, 3 filters, 2 distinct counts) over the example schema, against
// goavro decoding the same bytes into maps (what a generic decoder costs) and
// today's fixed-schema decoder on a Transaction of the same ids (the floor).
func BenchmarkDecodeExample(b *testing.B) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		b.Fatal(err)
	}
	schema := exampleSchema(b)
	c := mustCompile(b, d, schema)
	value := encodeExample(b, exampleRecord())
	b.Run("walker", func(b *testing.B) {
		dec := c.Decoder()
		var tx codec.Transaction
		b.ReportAllocs()
		b.SetBytes(int64(len(value)))
		for b.Loop() {
			if rej := dec.Decode(value, 0, false, &tx); rej != nil {
				b.Fatal(rej)
			}
		}
	})
	b.Run("goavro-reference", func(b *testing.B) {
		ref := newRef(d, schema)
		b.ReportAllocs()
		b.SetBytes(int64(len(value)))
		for b.Loop() {
			if r := ref.decode(value, 0, false); r.rej != nil {
				b.Fatal(r.rej)
			}
		}
	})
	b.Run("codec-fixed-schema", func(b *testing.B) {
		dec, err := codec.NewDecoder("", codec.Limits{})
		if err != nil {
			b.Fatal(err)
		}
		in := codec.Transaction{EventID: "t-1", EntityID: "card-A", AmountMinor: 123456, EventTime: 1_700_000_000_123}
		v := codec.EncodeTransaction(&in)
		var tx codec.Transaction
		b.ReportAllocs()
		b.SetBytes(int64(len(v)))
		for b.Loop() {
			if rej := dec.Decode(v, 0, false, &tx); rej != nil {
				b.Fatal(rej)
			}
		}
	})
}

// The walker allocates only the two id strings.
func TestDecodeAllocations(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, exampleSchema(t))
	value := encodeExample(t, exampleRecord())
	dec := c.Decoder()
	var tx codec.Transaction
	allocs := testing.AllocsPerRun(200, func() {
		if rej := dec.Decode(value, 0, false, &tx); rej != nil {
			t.Fatal(rej)
		}
	})
	if allocs > 2 {
		t.Fatalf("%v allocations per record, want at most the 2 id strings", allocs)
	}
}
