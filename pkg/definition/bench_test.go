package definition

import (
	"strconv"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/internal/cpuclock"
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

// withGroups is d keeping only its first n re-keyed groups.
func withGroups(d *Definition, n int) *Definition {
	c := *d
	c.Groups = d.Groups[:n]
	if n == 0 {
		c.Groups = nil
	}
	return &c
}

// BenchmarkDecodeGroups is the per-record cost of the groups example
// (payment_groups.yaml) keeping 0, 1 (device) and 2 (device, ip) of its
// re-keyed groups, over one record that has both keys: what each group's key
// and words add to the in-place decode.
func BenchmarkDecodeGroups(b *testing.B) {
	d := paymentDef(b)
	schema := paymentSchema(b)
	value := encodeWith(b, schema, paymentRecord())
	for _, n := range []int{0, 1, 2} {
		for _, borrow := range []bool{false, true} {
			dec := mustCompile(b, withGroups(d, n), schema).Decoder()
			decode := dec.Decode
			name := "groups=" + strconv.Itoa(n)
			if borrow {
				decode, name = dec.(codec.BorrowingDecoder).DecodeBorrowed, name+"/borrowed"
			}
			b.Run(name, func(b *testing.B) {
				var tx codec.Transaction
				b.ReportAllocs()
				b.SetBytes(int64(len(value)))
				cpu0 := cpuclock.Nanos()
				for b.Loop() {
					if rej := decode(value, 0, false, &tx); rej != nil {
						b.Fatal(rej)
					}
				}
				b.ReportMetric(float64(cpuclock.Nanos()-cpu0)/float64(b.N), "cpu-ns/op")
				if len(tx.Groups) != n {
					b.Fatalf("%d groups decoded, want %d", len(tx.Groups), n)
				}
			})
		}
	}
}

// With groups, the walker allocates the two id strings and one string per
// present key, and nothing for an absent key or for the groups' words.
func TestDecodeGroupsAllocations(t *testing.T) {
	d := paymentDef(t)
	schema := paymentSchema(t)
	noKeys := paymentRecord()
	noKeys["device_id"], noKeys["ip"] = nil, nil
	for _, tc := range []struct {
		name   string
		groups int
		rec    map[string]any
		max    float64
	}{
		{"no groups", 0, paymentRecord(), 2},
		{"one group", 1, paymentRecord(), 3},
		{"two groups", 2, paymentRecord(), 4},
		{"two groups, no keys", 2, noKeys, 2},
	} {
		dec := mustCompile(t, withGroups(d, tc.groups), schema).Decoder()
		value := encodeWith(t, schema, tc.rec)
		var tx codec.Transaction
		allocs := testing.AllocsPerRun(200, func() {
			if rej := dec.Decode(value, 0, false, &tx); rej != nil {
				t.Fatal(rej)
			}
		})
		if allocs > tc.max {
			t.Errorf("%s: %v allocations per record, want at most %v (ids and present keys)", tc.name, allocs, tc.max)
		}
		borrowed := testing.AllocsPerRun(200, func() {
			if rej := dec.(codec.BorrowingDecoder).DecodeBorrowed(value, 0, false, &tx); rej != nil {
				t.Fatal(rej)
			}
		})
		if borrowed != 0 {
			t.Errorf("%s: %v allocations per record with the ids and keys borrowed, want none", tc.name, borrowed)
		}
	}
}
