package definition

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// FuzzParse: any input either parses into a definition that satisfies the
// parser's own invariants, or fails with a located *Error; never a panic.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile("../../examples/features/card_features.yaml"); err == nil {
		f.Add(b)
	}
	if b, err := os.ReadFile("../../examples/features/payment_groups.yaml"); err == nil {
		f.Add(b)
	}
	f.Add([]byte(minimal))
	f.Add([]byte(groupsMinimal))
	f.Add([]byte(paymentBase))
	f.Add([]byte(wideDef))
	f.Add([]byte(wideDoubleDef))
	f.Add([]byte(`{"input": {"event_id": "a", "entity_id": "b", "event_time": "c"}, "windows": ["1m:1s"], "features": [{"name": "n", "agg": "count", "windows": ["1m"]}]}`))
	f.Add([]byte("x: &a [1]\ny: *a\n"))
	// The schema is parsed once: goavro's parse would dominate each run.
	wide, _, err := parseSchema(wideSchema)
	if err != nil {
		f.Fatal(err)
	}
	payment, _, err := parseSchema(paymentSchema(f))
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
		checkBlock(t, "in place", d.Windows, d.Features, d.Filters, d.Distincts)
		if !groupNameRule.MatchString(d.Group) || len(d.Groups) > MaxGroups || (d.Groups != nil && len(d.Groups) == 0) {
			t.Fatalf("group %q, %d groups", d.Group, len(d.Groups))
		}
		names, keys := map[string]bool{d.Group: true}, map[string]bool{d.Input.EntityID: true}
		for _, g := range d.Groups {
			if !groupNameRule.MatchString(g.Name) || names[g.Name] || keys[g.Key] || g.Key == "" {
				t.Fatalf("group %q key %q: a name or key taken or invalid", g.Name, g.Key)
			}
			names[g.Name], keys[g.Key] = true, true
			checkBlock(t, g.Name, g.Windows, g.Features, g.Filters, g.Distincts)
		}
		if len(d.paths()) > MaxPaths {
			t.Fatalf("%d paths", len(d.paths()))
		}
		if d.Hash() != d.Hash() || len(d.Hash()) != 16 {
			t.Fatal("hash unstable")
		}
		// Compiling either works or errs, and what compiles reads a record.
		for _, schema := range []*node{wide, payment} {
			if c, err := compileParsed(d, schema, codec.Limits{}.WithDefaults()); err == nil {
				var tx codec.Transaction
				if rej := c.Decoder().Decode(data, 0, false, &tx); rej == nil && len(tx.Groups) != len(d.Groups) {
					t.Fatalf("%d groups decoded, %d declared", len(tx.Groups), len(d.Groups))
				}
			} else {
				var de *Error
				if !errors.As(err, &de) || de.File != "f.yaml" || de.Line == 0 {
					t.Fatalf("unlocated compile error %v (%T)", err, err)
				}
			}
		}
	})
}

// checkBlock holds one group's parsed lists to the parser's invariants.
func checkBlock(t *testing.T, name string, windows []window.Spec, features []Feature, filters []Filter, distincts []string) {
	t.Helper()
	if len(windows) == 0 || len(features) == 0 || len(features) > MaxFeatures || len(filters) > MaxFilters || len(distincts) > MaxDistincts {
		t.Fatalf("%s: invariants broken: %d windows %d features %d filters %d distincts", name, len(windows), len(features), len(filters), len(distincts))
	}
	for _, ft := range features {
		if len(ft.Windows) == 0 || (ft.Filter >= len(filters)) || (ft.Agg == AggDistinctCount) != (ft.Distinct >= 0) || ft.Distinct >= len(distincts) {
			t.Fatalf("%s: feature %+v", name, ft)
		}
		for _, w := range ft.Windows {
			if w < 0 || w >= len(windows) {
				t.Fatalf("%s: feature %s window %d", name, ft.Name, w)
			}
		}
	}
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

// FuzzDecodeGroups: arbitrary bytes through the groups example's decoder:
// never a panic, goavro's reading (keys and every group's words) when goavro
// accepts, and each group's key and words what a one-group definition of it
// computes.
func FuzzDecodeGroups(f *testing.F) {
	schema := paymentSchema(f)
	d := paymentDef(f)
	c := mustCompile(f, d, schema)
	ref := newRef(d, schema)
	var ones []codec.Decoder
	for i := range d.Groups {
		ones = append(ones, mustCompile(f, oneGroup(d, i), schema).Decoder())
	}
	f.Add(encodeWith(f, schema, paymentRecord()))
	for _, change := range []func(map[string]any){
		func(m map[string]any) { m["device_id"], m["ip"] = nil, nil },
		func(m map[string]any) { m["device_id"] = goavro.Union("string", "") },
		func(m map[string]any) { m["ip"] = goavro.Union("string", "\xff") },
		func(m map[string]any) { m["device_id"] = goavro.Union("string", strings.Repeat("d", 257)) },
		func(m map[string]any) { m["merchant"], m["status"] = nil, "APPROVED" },
	} {
		rec := paymentRecord()
		change(rec)
		f.Add(encodeWith(f, schema, rec))
	}
	seen := map[string]int{}
	f.Fuzz(func(t *testing.T, value []byte) {
		checkSame(t, c.Decoder(), ref, value, 0, false)
		checkGroupsAgree(t, d, c.Decoder(), ones, value, seen)
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
