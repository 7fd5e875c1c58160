package definition

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// FuzzParse: any input either parses into a definition that satisfies the
// parser's own invariants, or fails with a located *Error; never a panic.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../../examples/features/card_features.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(minimal))
	f.Add([]byte(wideDef))
	f.Add([]byte(wideDoubleDef))
	f.Add([]byte(`{"input": {"event_id": "a", "entity_id": "b", "event_time": "c"}, "windows": ["1m:1s"], "features": [{"name": "n", "agg": "count", "windows": ["1m"]}]}`))
	f.Add([]byte("x: &a [1]\ny: *a\n"))
	// The schema is parsed once: goavro's parse would dominate each run.
	wide, _, err := parseSchema(wideSchema)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse("f.yaml", data)
		if err != nil {
			var de *Error
			if !errors.As(err, &de) || de.File != "f.yaml" || de.Msg == "" {
				t.Fatalf("unlocated error %v (%T)", err, err)
			}
			return
		}
		if len(d.Windows) == 0 || len(d.Features) == 0 || len(d.Filters) > MaxFilters || len(d.Distincts) > MaxDistincts {
			t.Fatalf("invariants broken: %+v", d)
		}
		for _, ft := range d.Features {
			if len(ft.Windows) == 0 || (ft.Filter >= len(d.Filters)) || (ft.Agg == AggDistinctCount) != (ft.Distinct >= 0) {
				t.Fatalf("feature %+v", ft)
			}
			for _, w := range ft.Windows {
				if w < 0 || w >= len(d.Windows) {
					t.Fatalf("feature %s window %d", ft.Name, w)
				}
			}
		}
		if d.Hash() != d.Hash() || len(d.Hash()) != 16 {
			t.Fatal("hash unstable")
		}
		// Compiling either works or errs, and what compiles reads a record.
		if c, err := compileParsed(d, wide, codec.Limits{}.WithDefaults()); err == nil {
			var tx codec.Transaction
			c.Decoder().Decode(data, 0, false, &tx)
		}
	})
}

// FuzzDecode: arbitrary bytes through the example and the wide decoders:
// never a panic, a typed reason, and goavro's reading when goavro accepts.
func FuzzDecode(f *testing.F) {
	example := exampleSchema(f)
	exDef, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		f.Fatal(err)
	}
	exC := mustCompile(f, exDef, example)
	exRef := newRef(exDef, example)
	wDef := mustParse(f, "wide.yaml", wideDef)
	wC := mustCompile(f, wDef, wideSchema)
	wRef := newRef(wDef, wideSchema)
	f.Add(encodeExample(f, exampleRecord()), false)
	f.Add([]byte{2, 2}, true)
	rec := exampleRecord()
	rec["merchant"] = nil
	f.Add(encodeExample(f, rec), false)
	f.Fuzz(func(t *testing.T, value []byte, wide bool) {
		if wide {
			checkSame(t, wC.Decoder(), wRef, value, 1_700_000_500_000, true)
			return
		}
		checkSame(t, exC.Decoder(), exRef, value, 0, false)
	})
}

// A seed corpus entry for every decode rejection class, checked in normal
// test runs (the fuzz target only runs them under -fuzz or as seeds).
func TestDecodeCorpus(t *testing.T) {
	example := exampleSchema(t)
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, example)
	ref := newRef(d, example)
	good := encodeExample(t, exampleRecord())
	seen := map[string]bool{}
	for cut := 0; cut <= len(good); cut++ {
		if rej := checkSame(t, c.Decoder(), ref, good[:cut], 0, false); rej != nil {
			seen[rej.Detail[strings.Index(rej.Detail, ": ")+2:][:8]] = true
		}
	}
	for i := range good {
		for _, x := range []byte{0x01, 0x80, 0xff, 0x7f} {
			b := append([]byte(nil), good...)
			b[i] ^= x
			checkSame(t, c.Decoder(), ref, b, 0, false)
		}
	}
	if len(seen) < 2 {
		t.Fatalf("truncations produced only %v", seen)
	}
}
