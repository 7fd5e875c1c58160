package repartition

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
)

func sampleEvent() Record {
	return Record{
		Kind: KindEvent, Epoch: 7, Watermark: 1_700_000_000_000 - 250,
		Event: Event{
			Source: 3, Offset: 123456, EventTime: 1_700_000_000_000, Topic: "transactions",
			Key: "device-42", EventID: "evt-0001", Amount: 1999, Ext: []uint64{0b101, 0xdeadbeefcafef00d, 0},
		},
	}
}

func TestRecordRoundTrip(t *testing.T) {
	cases := []struct {
		name string
		r    Record
	}{
		{"event", sampleEvent()},
		{"event without words", Record{Kind: KindEvent, Watermark: 5, Event: Event{Source: 0, Offset: 0, EventTime: 5, Key: "k", EventID: "i"}}},
		{"event at its watermark, no watermark yet", Record{Kind: KindEvent, Watermark: NoWatermark, Event: Event{EventTime: MaxEventTime, Key: "k", EventID: "i", Amount: -1}}},
		{"event at the most negative time", Record{Kind: KindEvent, Watermark: math.MinInt64, Event: Event{EventTime: math.MinInt64, Key: "ключ", EventID: "ид"}}},
		{"event with 33 words", Record{Kind: KindEvent, Watermark: 1, Event: Event{EventTime: 2, Key: "k", EventID: "i", Ext: make([]uint64, MaxExtWords)}}},
		{"event with the longest fields", Record{Kind: KindEvent, Epoch: math.MaxUint64, Watermark: 0, Event: Event{Source: math.MaxInt32, Offset: math.MaxInt64, Topic: strings.Repeat("t", MaxTopicBytes), Key: strings.Repeat("k", MaxKeyBytes), EventID: strings.Repeat("e", MaxEventIDBytes)}}},
		{"marker", Record{Kind: KindMarker, Epoch: 2, Watermark: 1_700_000_000_000, Event: Event{Source: 11}}},
		{"idle marker", Record{Kind: KindMarker, Watermark: NoWatermark, Idle: true, Event: Event{Source: 0}}},
		{"leased idle marker", Record{Kind: KindMarker, Epoch: 7, Watermark: 1_700_000_000_000, Idle: true, Lease: 1000, Event: Event{Source: 3}}},
		{"the longest lease", Record{Kind: KindMarker, Watermark: -5, Idle: true, Lease: MaxLease, Event: Event{Source: 3}}},
		{"end-of-stream marker", Record{Kind: KindMarker, Watermark: math.MaxInt64, Event: Event{Source: 1}}},
	}
	var d Decoder
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := AppendRecord([]byte("prefix"), &c.r)
			if err != nil {
				t.Fatal(err)
			}
			if string(b[:6]) != "prefix" {
				t.Fatal("AppendRecord overwrote dst")
			}
			var got Record
			if err := d.Decode(b[6:], &got); err != nil {
				t.Fatal(err)
			}
			want := c.r
			if want.Ext == nil {
				want.Ext = got.Ext[:0:0] // decoding gives an empty slice; compare contents
				if len(got.Ext) != 0 {
					t.Fatalf("Ext %v, want none", got.Ext)
				}
				got.Ext = want.Ext
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("decoded\n%+v\nwant\n%+v", got, want)
			}
			again, _ := AppendRecord(nil, &got)
			if !bytes.Equal(again, b[6:]) {
				t.Fatal("re-encoding differs")
			}
		})
	}
}

func TestRecordRefused(t *testing.T) {
	good := sampleEvent()
	enc := func(r Record) []byte {
		b, err := AppendRecord(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	goodBytes := enc(good)
	with := func(f func(*Record)) Record { r := good; r.Ext = append([]uint64(nil), good.Ext...); f(&r); return r }
	encodeCases := []struct {
		name string
		r    Record
		want error
	}{
		{"watermark above event time", with(func(r *Record) { r.Watermark = r.EventTime + 1 }), ErrWatermark},
		{"reserved event time", with(func(r *Record) { r.EventTime, r.Watermark = math.MaxInt64, 0 }), ErrEventTime},
		{"negative source", with(func(r *Record) { r.Source = -1 }), ErrSource},
		{"negative offset", with(func(r *Record) { r.Offset = -1 }), ErrOffset},
		{"empty key", with(func(r *Record) { r.Key = "" }), ErrKey},
		{"long key", with(func(r *Record) { r.Key = strings.Repeat("k", MaxKeyBytes+1) }), ErrKey},
		{"key not UTF-8", with(func(r *Record) { r.Key = "\xff" }), ErrKey},
		{"empty event id", with(func(r *Record) { r.EventID = "" }), ErrEventID},
		{"long event id", with(func(r *Record) { r.EventID = strings.Repeat("e", MaxEventIDBytes+1) }), ErrEventID},
		{"long topic", with(func(r *Record) { r.Topic = strings.Repeat("t", MaxTopicBytes+1) }), ErrTopic},
		{"topic not UTF-8", with(func(r *Record) { r.Topic = "a\xc0" }), ErrTopic},
		{"too many words", with(func(r *Record) { r.Ext = make([]uint64, MaxExtWords+1) }), ErrExtWords},
		{"unknown kind", with(func(r *Record) { r.Kind = 3 }), ErrKind},
		{"lease on a marker that is not idle", Record{Kind: KindMarker, Lease: 1}, ErrLease},
		{"negative lease", Record{Kind: KindMarker, Idle: true, Lease: -1}, ErrLease},
		{"lease above MaxLease", Record{Kind: KindMarker, Idle: true, Lease: MaxLease + 1}, ErrLease},
	}
	for _, c := range encodeCases {
		t.Run("encode/"+c.name, func(t *testing.T) {
			b, err := AppendRecord([]byte{9}, &c.r)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if len(b) != 1 {
				t.Fatal("a refused record was partly written")
			}
		})
	}

	// Byte-level corruptions of a good record, each refused for its own reason.
	set := func(i int, v ...byte) []byte {
		b := append([]byte(nil), goodBytes...)
		return append(b[:i], append(v, b[i+len(v):]...)...)
	}
	decodeCases := []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version only", []byte{RecordVersion}, ErrTruncated},
		{"version 2", set(0, 2), ErrVersion},
		{"kind 0", set(1, 0), ErrKind},
		{"non-minimal epoch", append([]byte{1, 1, 0x87, 0x00}, goodBytes[3:]...), ErrVarint},
		{"truncated in the words", goodBytes[:len(goodBytes)-1], ErrTruncated},
		{"trailing byte", append(append([]byte(nil), goodBytes...), 0), ErrTrailing},
		{"overlong varint", []byte{1, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, ErrVarint},
		{"source above int32", []byte{1, 2, 0, 0x80, 0x80, 0x80, 0x80, 0x08, 0, 0}, ErrSource},
		{"marker flag 4", []byte{1, 2, 0, 0, 0, 4}, ErrMarkerFlag},
		{"lease without idle", []byte{1, 2, 0, 0, 0, 2, 1}, ErrLease},
		{"lease 0", []byte{1, 2, 0, 0, 0, 3, 0}, ErrLease},
		{"lease above MaxLease", []byte{1, 2, 0, 0, 0, 3, 0x81, 0xb8, 0x99, 0x29}, ErrLease},
		{"lease missing", []byte{1, 2, 0, 0, 0, 3}, ErrTruncated},
		{"lease non-minimal", []byte{1, 2, 0, 0, 0, 3, 0x81, 0x00}, ErrVarint},
		{"marker without flags", []byte{1, 2, 0, 0, 0}, ErrTruncated},
		{"watermark below MinInt64", []byte{1, 1, 0, 0, 0, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01}, ErrWatermark},
	}
	var d Decoder
	for _, c := range decodeCases {
		t.Run("decode/"+c.name, func(t *testing.T) {
			var r Record
			err := d.Decode(c.b, &r)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("err %T is not a *DecodeError", err)
			}
		})
	}

	// Field rules that only a hand-built value can break.
	field := func(key, id, topic string) []byte {
		b := []byte{1, 1, 0, 0, 0, 2, 0, 0}
		b = appendString(b, topic)
		b = appendString(b, key)
		b = appendString(b, id)
		return append(b, 0)
	}
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty key", field("", "i", "t"), ErrKey},
		{"key not UTF-8", field("\xff", "i", "t"), ErrKey},
		{"long key", field(strings.Repeat("k", MaxKeyBytes+1), "i", "t"), ErrKey},
		{"empty id", field("k", "", "t"), ErrEventID},
		{"id not UTF-8", field("k", "\xfe", "t"), ErrEventID},
		{"topic not UTF-8", field("k", "i", "\xc3"), ErrTopic},
	} {
		t.Run("decode/"+c.name, func(t *testing.T) {
			var r Record
			if err := d.Decode(c.b, &r); !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
		})
	}
	var r Record
	if err := d.Decode(field("k", "i", "t"), &r); err != nil {
		t.Fatalf("the hand-built base value is refused: %v", err)
	}
}

// TestDecodeAllocations: after the first record the topic is reused, so an event costs
// one allocation (the string its key and event id share), and a marker nothing.
func TestDecodeAllocations(t *testing.T) {
	r := sampleEvent()
	ev, _ := AppendRecord(nil, &r)
	mk, _ := AppendRecord(nil, &Record{Kind: KindMarker, Watermark: 5, Event: Event{Source: 1}})
	var d Decoder
	var out Record
	if err := d.Decode(ev, &out); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(200, func() { _ = d.Decode(ev, &out) }); a != 1 {
		t.Fatalf("event decode: %v allocations, want 1", a)
	}
	if a := testing.AllocsPerRun(200, func() { _ = d.Decode(mk, &out) }); a != 0 {
		t.Fatalf("marker decode: %v allocations, want 0", a)
	}
	buf := make([]byte, 0, 256)
	if a := testing.AllocsPerRun(200, func() { buf, _ = AppendRecord(buf[:0], &r) }); a != 0 {
		t.Fatalf("encode: %v allocations, want 0", a)
	}
}

func TestEventWatermark(t *testing.T) {
	for _, c := range []struct{ t, stage, want int64 }{
		{100, 250, 100}, // an ordinary release: the event is at or below the stage watermark
		{300, 250, 250}, // released by the source's idle rule, above its watermark
		{100, NoWatermark, NoWatermark},
	} {
		if got := EventWatermark(c.t, c.stage); got != c.want {
			t.Errorf("EventWatermark(%d, %d) = %d, want %d", c.t, c.stage, got, c.want)
		}
		r := Record{Kind: KindEvent, Watermark: EventWatermark(c.t, c.stage), Event: Event{EventTime: c.t, Key: "k", EventID: "i"}}
		if _, err := AppendRecord(nil, &r); err != nil {
			t.Errorf("the watermark EventWatermark gives is refused: %v", err)
		}
	}
}

// TestPeekWatermark: the kind and watermark of every record AppendRecord writes, and
// Decode's refusals of the fields before the watermark.
func TestPeekWatermark(t *testing.T) {
	far := sampleEvent()
	far.EventTime, far.Watermark = MaxEventTime, NoWatermark
	for _, r := range []Record{sampleEvent(), far, hop(3, 7, 100, 95), hop(0, 0, -5, -5), mark(2, 99), mark(1, NoWatermark), idleMark(4, math.MaxInt64, 9)} {
		b, err := AppendRecord(nil, &r)
		if err != nil {
			t.Fatal(err)
		}
		kind, w, err := PeekWatermark(b)
		if err != nil || kind != r.Kind || w != r.Watermark {
			t.Errorf("PeekWatermark(%+v) = %v, %d, %v; want %v, %d", r, kind, w, err, r.Kind, r.Watermark)
		}
	}
	ev, _ := AppendRecord(nil, &[]Record{hop(3, 7, 100, 95)}[0])
	for _, c := range []struct {
		name string
		b    []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"version only", []byte{1}, ErrTruncated},
		{"other version", append([]byte{2}, ev[1:]...), ErrVersion},
		{"unknown kind", append([]byte{1, 3}, ev[2:]...), ErrKind},
		{"cut in the watermark", ev[:6], ErrTruncated},
		{"non-minimal epoch", append([]byte{1, 1, 0x80, 0x00}, ev[3:]...), ErrVarint},
		{"source above int32", append([]byte{1, 1, 0, 0x80, 0x80, 0x80, 0x80, 0x08}, ev[4:]...), ErrSource},
	} {
		if _, _, err := PeekWatermark(c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: PeekWatermark(%x) = %v; want %v", c.name, c.b, err, c.want)
		}
	}
}

// TestDecodeStringsOutliveTheirBytes: the key and event id of a decoded event stay what
// was decoded while the Merger holds them, however many events are decoded after it
// and whatever the caller does with the value's bytes afterwards (the fetch buffer is
// not ours): a decoder that let them alias b, or reused a buffer of its own, fails.
func TestDecodeStringsOutliveTheirBytes(t *testing.T) {
	cases := []struct {
		name    string
		n       int // events decoded, each kept
		keyLen  int
		idLen   int
		reuseIn bool // every value decoded from the same buffer, overwritten each time
	}{
		{"one", 1, 9, 8, true},
		{"within one chunk", 50, 10, 36, true},
		{"many", 1200, 10, 26, true},
		{"longest key and id", 150, MaxKeyBytes, MaxEventIDBytes, true},
		{"fresh buffers", 1600, 5, 12, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var d Decoder
			var in []byte
			type kept struct{ key, id string }
			var got []kept
			want := func(i int) kept {
				k := fmt.Sprintf("k%0*d", c.keyLen-1, i)
				id := fmt.Sprintf("i%0*d", c.idLen-1, i)
				return kept{k[len(k)-c.keyLen:], id[len(id)-c.idLen:]}
			}
			for i := range c.n {
				w := want(i)
				r := Record{Kind: KindEvent, Event: Event{Source: 1, Offset: int64(i), Topic: "t", Key: w.key, EventID: w.id}}
				var err error
				if c.reuseIn {
					in, err = AppendRecord(in[:0], &r)
				} else {
					in, err = AppendRecord(nil, &r)
				}
				if err != nil {
					t.Fatal(err)
				}
				var out Record
				if err := d.Decode(in, &out); err != nil {
					t.Fatalf("record %d: %v", i, err)
				}
				got = append(got, kept{out.Key, out.EventID})
				for j := range in {
					in[j] = 0xff // the caller's bytes are gone
				}
			}
			for i, g := range got {
				if w := want(i); g != w {
					t.Fatalf("event %d: key %q, event id %q; want %q, %q", i, g.key, g.id, w.key, w.id)
				}
			}
		})
	}
}
