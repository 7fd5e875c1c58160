package repartition

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"hash/crc32"
	"maps"
	"slices"
	"testing"
)

// FuzzDecodeRecord: Decode never panics, and whatever it accepts is canonical (the
// encoder writes the same bytes back) and obeys the hop's rules.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []Record{sampleEvent(), hop(0, 0, 5, 5), mark(3, 99), idleMark(1, NoWatermark, 4), leased(1, 50, 4, 1000)} {
		b, err := AppendRecord(nil, &r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{1, 1})
	f.Add([]byte{1, 2, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		var d Decoder
		var r Record
		kind, w, perr := PeekWatermark(b)
		if err := d.Decode(b, &r); err != nil {
			return
		}
		if perr != nil || kind != r.Kind || w != r.Watermark {
			t.Fatalf("PeekWatermark = %v, %d, %v; Decode gave %v, %d", kind, w, perr, r.Kind, r.Watermark)
		}
		if r.Kind == KindEvent && (r.Watermark > r.EventTime || r.EventTime > MaxEventTime || r.Key == "" || r.EventID == "") {
			t.Fatalf("accepted an event breaking the hop's rules: %+v", r)
		}
		again, err := AppendRecord(nil, &r)
		if err != nil {
			t.Fatalf("decoded %+v, which the encoder refuses: %v", r, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("not canonical: %x re-encodes as %x", b, again)
		}
	})
}

// FuzzRestore: Restore never panics; an image it accepts is written back byte for
// byte, and the restored Merger goes on working (a drain releases every pending event
// in order). The fuzzer mutates the image without its checksum and the target seals
// it, so that mutations reach the parser instead of stopping at the CRC (the refusal
// of a bad checksum is TestRestoreRefuses').
func FuzzRestore(f *testing.F) {
	cfg := Config{Sources: 3, ExtWords: simExtWords}
	_, recs := snapshotStream(3)
	m, _ := New(cfg)
	for i := range recs {
		if i%97 == 0 {
			img := m.AppendSnapshot(nil)
			f.Add(img[:len(img)-4])
		}
		m.Offer(&recs[i])
		if i%3 == 0 {
			m.Ready(nil)
		}
	}
	// Small images too, so that mutations reach every field quickly.
	small, _ := New(cfg)
	for i, r := range []Record{hop(0, 0, 100, 10), hop(0, 1, 110, 10), idleMark(0, 10, 1), mark(1, 200), hop(0, 2, 105, 105), mark(2, 150)} {
		r.Ext = make([]uint64, simExtWords)
		if r.Kind == KindMarker {
			r.Ext = nil
		}
		small.Offer(&r)
		img := small.AppendSnapshot(nil)
		f.Add(img[:len(img)-4])
		if i%2 == 1 {
			small.Ready(nil)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b := binary.LittleEndian.AppendUint32(slices.Clip(body), crc32.Checksum(body, castagnoli))
		m, err := Restore(cfg, b)
		if err != nil {
			return
		}
		if again := m.AppendSnapshot(nil); !bytes.Equal(again, b) {
			t.Fatal("accepted image is not written back identically")
		}
		pending := m.Pending()
		for p := range int32(cfg.Sources) {
			r := mark(p, 1<<62)
			if _, err := m.Offer(&r); err != nil {
				t.Fatal(err)
			}
		}
		out := m.Ready(nil)
		for i := 1; i < len(out); i++ {
			a, c := out[i-1], out[i]
			if a.EventTime > c.EventTime || a.EventTime == c.EventTime && (a.Source > c.Source || a.Source == c.Source && a.Offset >= c.Offset) {
				t.Fatalf("restored merger released %s before %s", evString(a), evString(c))
			}
		}
		if len(out)+m.Pending() != pending {
			t.Fatalf("%d released + %d pending != %d restored", len(out), m.Pending(), pending)
		}
	})
}

// FuzzMergerArrivalOrder: two sources hop events in any order their watermark allows
// (late ones behind their newest, re-sends of earlier ones); the Merger says Duplicate
// exactly for the re-sends, a snapshot taken before the release restores to the same
// image, and once both sources promise everything the release is every event once, in
// (event time, source, offset) order. Each input byte is one record: bit 7 the source,
// bits 0-5 how far behind the source's newest time it lies (0 = a new newest), bit 6 a
// re-send of that source's event that many events back instead.
func FuzzMergerArrivalOrder(f *testing.F) {
	f.Add([]byte{0, 1, 128, 5, 3, 129, 64 | 1, 0, 2})
	f.Add([]byte{10, 20, 30, 40, 128 | 63, 128 | 2, 64, 128 | 64 | 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		const lateness = 64
		type key struct {
			p      int32
			t, off int64
		}
		cfg := Config{Sources: 2, ExtWords: 1}
		m, _ := New(cfg)
		var newest, next [2]int64
		var sent [2][]key
		want := map[key]bool{}
		for _, c := range b {
			p := int32(c >> 7)
			d := int64(c & 63)
			var k key
			resend := c&64 != 0
			if resend {
				if d >= int64(len(sent[p])) {
					continue
				}
				k = sent[p][int64(len(sent[p]))-1-d]
			} else {
				if d == 0 {
					newest[p] += 3
				}
				k = key{p, newest[p] - d, next[p]}
				next[p]++
				sent[p] = append(sent[p], k)
				want[k] = true
			}
			r := Record{Kind: KindEvent, Watermark: min(k.t, newest[p]-lateness), Event: Event{
				Source: p, Offset: k.off, EventTime: k.t, Topic: "in", Key: "k", EventID: "e", Ext: []uint64{uint64(k.off)}}}
			v, err := m.Offer(&r)
			if err != nil {
				t.Fatal(err)
			}
			if resend != (v == Duplicate) || !resend && v != Accepted {
				t.Fatalf("record %+v (re-send %v): %v", k, resend, v)
			}
		}
		img := m.AppendSnapshot(nil)
		m2, err := Restore(cfg, img)
		if err != nil {
			t.Fatal(err)
		}
		if again := m2.AppendSnapshot(nil); !bytes.Equal(again, img) {
			t.Fatal("restored image differs")
		}
		for p := range int32(2) {
			r := Record{Kind: KindMarker, Watermark: max(newest[0], newest[1]) + 1, Event: Event{Source: p}}
			if _, err := m.Offer(&r); err != nil {
				t.Fatal(err)
			}
		}
		var got []key
		for _, e := range m.Ready(nil) {
			got = append(got, key{e.Source, e.EventTime, e.Offset})
			if e.Ext[0] != uint64(e.Offset) {
				t.Fatalf("event %+v released with the words of another", e)
			}
		}
		sorted := slices.Collect(maps.Keys(want))
		slices.SortFunc(sorted, func(a, b key) int {
			return cmp.Or(cmp.Compare(a.t, b.t), cmp.Compare(a.p, b.p), cmp.Compare(a.off, b.off))
		})
		if !slices.Equal(got, sorted) {
			t.Fatalf("released %v, want %v", got, sorted)
		}
	})
}
