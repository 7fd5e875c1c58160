package codec

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// knownReason reports whether r is one Decode may produce: a dead letter's
// reason header must be one the contract names.
func knownReason(r Reason) bool {
	switch r {
	case ReasonDecode, ReasonTooLarge, ReasonInvalidEventID, ReasonInvalidEntityID,
		ReasonInvalidAmountMinor, ReasonInvalidCurrency, ReasonInvalidEventTime:
		return true
	}
	return false
}

// goavroIsLaxHere reports whether a fast rejection is one goavro does not
// make: goavro drops varint bits past 64 instead of failing (binary.go), so on
// such input the reference's answer is not comparable.
func goavroIsLaxHere(r *Rejection) bool {
	return r != nil && r.Reason == ReasonDecode && strings.Contains(r.Detail, errVarintOverflow.String())
}

// checkDecode is the property shared by the fuzz target and the corpus table:
// no panic, either a transaction that passes validation and survives a round
// trip or a known typed reason, and the same answer from goavro.
func checkDecode(t *testing.T, fast, ref Decoder, value []byte, maxSeen int64, hasMaxSeen bool) *Rejection {
	t.Helper()
	var tx Transaction
	r := fast.Decode(value, maxSeen, hasMaxSeen, &tx)
	if r != nil {
		if !knownReason(r.Reason) || r.Detail == "" {
			t.Fatalf("untyped rejection %#v", r)
		}
	} else {
		l := DefaultLimits()
		if v := validate(&tx, &l, maxSeen, hasMaxSeen); v != nil {
			t.Fatalf("accepted an invalid transaction %+v: %v", tx, v)
		}
		var back Transaction
		if r2 := fast.Decode(EncodeTransaction(&tx), maxSeen, hasMaxSeen, &back); r2 != nil || !reflect.DeepEqual(back, tx) {
			t.Fatalf("round trip of %+v gave %+v, %v", tx, back, r2)
		}
	}
	if b, ok := fast.(BorrowingDecoder); ok {
		// The same answer with the ids left in value's bytes, and only then.
		var borrowed Transaction
		rb := b.DecodeBorrowed(value, maxSeen, hasMaxSeen, &borrowed)
		if !reflect.DeepEqual(rb, r) || r == nil && !reflect.DeepEqual(borrowed, tx) {
			t.Fatalf("DecodeBorrowed gave %+v, %v; Decode %+v, %v for %x", borrowed, rb, tx, r, value)
		}
		if r == nil && (!within(value, borrowed.EventID) || !within(value, borrowed.EntityID) || within(value, tx.EventID) || within(value, tx.EntityID)) {
			t.Fatalf("ids of %x: borrowed ones must be value's bytes, decoded ones a copy", value)
		}
	}
	var want Transaction
	rr := ref.Decode(value, maxSeen, hasMaxSeen, &want)
	switch {
	case goavroIsLaxHere(r):
	case (r == nil) != (rr == nil):
		t.Fatalf("fast says %v (%+v), goavro says %v (%+v) for %x", r, tx, rr, want, value)
	case r == nil && !reflect.DeepEqual(tx, want):
		t.Fatalf("fast decoded %+v, goavro %+v from %x", tx, want, value)
	case r != nil && r.Reason != rr.Reason:
		t.Fatalf("fast rejects with %v, goavro with %v for %x", r, rr, value)
	}
	return r
}

// within reports whether s's bytes lie inside b.
func within(b []byte, s string) bool {
	if len(b) == 0 || len(s) == 0 {
		return false
	}
	p, lo := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(&b[0]))
	return p >= lo && p+uintptr(len(s)) <= lo+uintptr(len(b))
}

func refDecoder(t testing.TB) (Decoder, Decoder) {
	fast, err := NewDecoder("", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := newGoavroDecoder(schemas.Transaction, DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	return fast, ref
}

func FuzzDecode(f *testing.F) {
	tx := goodTx()
	f.Add(EncodeTransaction(&tx), int64(t0), true)
	fast, ref := refDecoder(f)
	f.Fuzz(func(t *testing.T, value []byte, maxSeen int64, hasMaxSeen bool) {
		checkDecode(t, fast, ref, value, maxSeen, hasMaxSeen)
	})
}

func FuzzDecodeFeatures(f *testing.F) {
	ft := exampleFeatures()
	f.Add(AppendFeatures(nil, &ft))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := DecodeFeatures(b)
		want, refErr := goavroDecodeFeatures(b)
		if err == nil {
			again, err2 := DecodeFeatures(AppendFeatures(nil, &got))
			if err2 != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("re-encoding %+v decodes to %+v, %v", got, again, err2)
			}
			if refErr != nil {
				t.Fatalf("we decode %+v, goavro refuses: %v", got, refErr)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("we decode %+v, goavro %+v", got, want)
			}
			return
		}
		// goavro accepts overflowing varints and out-of-range ints by dropping bits.
		lax := strings.Contains(err.Error(), errVarintOverflow.String()) || strings.Contains(err.Error(), errIntOverflow.String())
		if refErr == nil && !lax {
			t.Fatalf("we refuse (%v), goavro decodes %+v", err, want)
		}
	})
}

// FuzzAppendFeatures checks the encoder against goavro, byte for byte, on
// arbitrary field values.
func FuzzAppendFeatures(f *testing.F) {
	f.Add("e5", "card-A", int64(t0), uint8(4), int64(1), int64(1300), true, false, "transactions", int32(3), int64(4))
	f.Fuzz(func(t *testing.T, eventID, entityID string, eventTime int64, nWindows uint8, seed int64,
		msPrev int64, hasPrev, late bool, topic string, partition int32, offset int64) {
		ft := Features{EventID: eventID, EntityID: entityID, EventTime: eventTime, MsSincePrevious: msPrev,
			HasPrevious: hasPrev, Late: late, SourceTopic: topic, SourcePartition: partition, SourceOffset: offset}
		for i := range int(nWindows % 8) {
			v := seed * int64(i+1) * 0x5851F42D4C957F2D
			ft.Windows = append(ft.Windows, WindowAgg{eventID[:len(eventID)*i/8], v, v >> 7, v >> 13, -v, v ^ 0x55, v >> 40})
		}
		got := AppendFeatures(nil, &ft)
		want, err := goavroFeatures(nil, &ft)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("AppendFeatures %x, goavro %x", got, want)
		}
		// Appending keeps what dst held, whether it had room or had to grow.
		for _, c := range []int{3, 3 + len(want), 512} {
			dst := append(make([]byte, 0, c), "pre"...)
			if got := AppendFeatures(dst, &ft); string(got[:3]) != "pre" || !bytes.Equal(got[3:], want) {
				t.Fatalf("AppendFeatures after 3 bytes (cap %d) = %x, want pre + %x", c, got, want)
			}
		}
	})
}

// readCorpus reads a file in Go's fuzz corpus format ("go test fuzz v1" and
// one Go literal per line) for the named tests below.
func readCorpus(t *testing.T, path string) (value []byte, maxSeen int64, hasMaxSeen bool) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if lines[0] != "go test fuzz v1" {
		t.Fatalf("%s: not a fuzz corpus file", path)
	}
	for _, line := range lines[1:] {
		open, closing := strings.Index(line, "("), strings.LastIndex(line, ")")
		arg := line[open+1 : closing]
		switch line[:open] {
		case "[]byte":
			s, err := strconv.Unquote(arg)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			value = []byte(s)
		case "int64":
			maxSeen, _ = strconv.ParseInt(arg, 10, 64)
		case "bool":
			hasMaxSeen = arg == "true"
		}
	}
	return value, maxSeen, hasMaxSeen
}

// The corpus is a set of real bad records; each has a name and the reason a
// dead letter for it must carry.
func TestDecodeCorpus(t *testing.T) {
	want := map[string]Reason{
		"valid":                             "",
		"empty_value":                       ReasonDecode,
		"truncated_mid_entity_id":           ReasonDecode,
		"truncated_event_time":              ReasonDecode,
		"trailing_garbage":                  ReasonDecode,
		"huge_length_prefix":                ReasonDecode,
		"negative_length_prefix":            ReasonDecode,
		"varint_overflow":                   ReasonDecode,
		"invalid_utf8_event_id":             ReasonInvalidEventID,
		"invalid_utf8_entity_id":            ReasonInvalidEntityID,
		"empty_entity_id":                   ReasonInvalidEntityID,
		"event_id_too_long":                 ReasonInvalidEventID,
		"negative_amount":                   ReasonInvalidAmountMinor,
		"lowercase_currency":                ReasonInvalidCurrency,
		"event_time_1970":                   ReasonInvalidEventTime,
		"event_time_far_ahead":              ReasonInvalidEventTime,
		"wrong_schema_features_record":      ReasonDecode,
		"wrong_schema_amount_as_string":     ReasonDecode,
		"wrong_encoding_json":               ReasonDecode,
		"confluent_prefix_without_registry": ReasonDecode,
	}
	files, err := filepath.Glob("testdata/fuzz/FuzzDecode/*")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Errorf("corpus has %d files, table has %d: keep them in step", len(files), len(want))
	}
	fast, ref := refDecoder(t)
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			reason, ok := want[name]
			if !ok {
				t.Fatalf("corpus file %s has no expected reason in this table", name)
			}
			value, maxSeen, hasMaxSeen := readCorpus(t, path)
			r := checkDecode(t, fast, ref, value, maxSeen, hasMaxSeen)
			switch {
			case reason == "" && r != nil:
				t.Fatalf("rejected: %v", r)
			case reason != "" && (r == nil || r.Reason != reason):
				t.Fatalf("got %v, want %s", r, reason)
			}
		})
	}
}

func TestDecodeFeaturesCorpus(t *testing.T) {
	wantOK := map[string]bool{"valid": true, "negative_block_count": true, "truncated": false,
		"huge_array_count": false, "bad_union_index": false, "transaction_record": false}
	files, _ := filepath.Glob("testdata/fuzz/FuzzDecodeFeatures/*")
	if len(files) != len(wantOK) {
		t.Errorf("corpus has %d files, table has %d", len(files), len(wantOK))
	}
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(name, func(t *testing.T) {
			ok, known := wantOK[name]
			if !known {
				t.Fatalf("corpus file %s not in the table", name)
			}
			value, _, _ := readCorpus(t, path)
			if _, err := DecodeFeatures(value); (err == nil) != ok {
				t.Fatalf("err = %v, want ok=%v", err, ok)
			}
		})
	}
}

// evolvedSchema is a producer's newer schema with the shapes that make goavro
// allocate from the wire (arrays, maps) and reordered, widened fields.
const evolvedSchema = `{"type":"record","name":"Transaction","namespace":"io.velocity.v2","fields":[
	{"name":"entity_id","type":"string"},{"name":"event_id","type":"string"},
	{"name":"tags","type":{"type":"array","items":"string"},"default":[]},
	{"name":"amount_minor","type":"int"},{"name":"attrs","type":{"type":"map","values":"long"},"default":{}},
	{"name":"currency","type":["null","string"],"default":null},{"name":"event_time","type":"long"}]}`

// FuzzDecodeEvolved feeds arbitrary bytes to the goavro resolving path: no
// panic, no runaway allocation, a valid transaction or a typed reason.
func FuzzDecodeEvolved(f *testing.F) {
	dec, err := NewDecoder(evolvedSchema, Limits{})
	if err != nil {
		f.Fatal(err)
	}
	good := cat(varint(6), []byte("card-A"), varint(2), []byte("e1"), varint(1), varint(3), []byte("vip"), varint(0),
		varint(1000), varint(0), varint(1), varint(3), []byte("EUR"), varint(t0))
	var tx Transaction
	if r := dec.Decode(good, 0, false, &tx); r != nil || !reflect.DeepEqual(tx, Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 1000, Currency: "EUR", EventTime: t0}) {
		f.Fatalf("seed record decodes to %+v, %v", tx, r)
	}
	f.Add(good)
	f.Add(cat(varint(1), []byte("A"), varint(1), []byte("e"), varint(math.MaxInt32-1)))
	f.Fuzz(func(t *testing.T, value []byte) {
		var tx Transaction
		r := dec.Decode(value, 0, false, &tx)
		if r != nil {
			if !knownReason(r.Reason) || r.Detail == "" {
				t.Fatalf("untyped rejection %#v", r)
			}
			return
		}
		l := DefaultLimits()
		if v := validate(&tx, &l, 0, false); v != nil {
			t.Fatalf("accepted an invalid transaction %+v: %v", tx, v)
		}
	})
}

// FuzzFeaturesEncoder: a FeaturesEncoder gives AppendFeatures' bytes for every
// record, the first and those after it, whether they keep the constant fields it
// encoded (windows, topic, partition) or change one of them (change picks which).
func FuzzFeaturesEncoder(f *testing.F) {
	f.Add("e5", "card-A", int64(t0), uint8(4), int64(1), int64(1300), true, false, "transactions", int32(3), int64(4), uint8(0))
	f.Add("e", "c", int64(-1), uint8(7), int64(-9), int64(0), false, true, "", int32(-1), int64(-4), uint8(5))
	f.Fuzz(func(t *testing.T, eventID, entityID string, eventTime int64, nWindows uint8, seed int64,
		msPrev int64, hasPrev, late bool, topic string, partition int32, offset int64, change uint8) {
		ft := Features{EventID: eventID, EntityID: entityID, EventTime: eventTime, MsSincePrevious: msPrev,
			HasPrevious: hasPrev, Late: late, SourceTopic: topic, SourcePartition: partition, SourceOffset: offset}
		for i := range int(nWindows % 8) {
			v := seed * int64(i+1) * 0x5851F42D4C957F2D
			ft.Windows = append(ft.Windows, WindowAgg{eventID[:len(eventID)*i/8] + strings.Repeat("w", i*int(change%8)), v, v >> 7, v >> 13, -v, v ^ 0x55, v >> 40})
		}
		var enc FeaturesEncoder
		check := func(step string) {
			t.Helper()
			want := AppendFeatures([]byte("pre"), &ft)
			if got := enc.Append([]byte("pre"), &ft); !bytes.Equal(got, want) {
				t.Fatalf("%s: FeaturesEncoder %x, AppendFeatures %x", step, got, want)
			}
		}
		check("first record")
		for k := range ft.Windows { // the per-event fields change, the constant ones stay
			w := &ft.Windows[k]
			w.Count, w.SumMinor, w.MinMinor, w.MaxMinor = w.Count^seed, w.SumMinor+1, w.MinMinor>>1, -w.MaxMinor
		}
		ft.EventTime, ft.SourceOffset, ft.HasPrevious = ft.EventTime+msPrev, offset^seed, !hasPrev
		check("next record")
		switch c := change % 6; {
		case c == 0 && len(ft.Windows) > 0:
			ft.Windows[len(ft.Windows)-1].Name += "x"
		case c == 1 && len(ft.Windows) > 0:
			ft.Windows[0].WindowMs++
		case c == 2 && len(ft.Windows) > 0:
			ft.Windows[0].BucketMs--
		case c == 3:
			ft.SourceTopic += "t"
		case c == 4:
			ft.SourcePartition ^= 1
		case c == 5:
			ft.Windows = append(ft.Windows, WindowAgg{Name: "extra", WindowMs: 1, BucketMs: 1})
		}
		check("record with a constant field changed")
		check("and the one after it")
	})
}
