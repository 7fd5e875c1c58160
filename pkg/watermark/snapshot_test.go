package watermark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// reseal replaces the trailing checksum so that a test can reach the structural checks
// behind it, as a bug in a writer (rather than a flipped bit) would.
func reseal(b []byte) []byte {
	b = slices.Clone(b)
	body := b[:len(b)-crcLen]
	binary.LittleEndian.PutUint32(b[len(body):], crc32.Checksum(body, castagnoli))
	return b
}

func sampleSnapshot(t testing.TB) (Config, []byte) {
	cfg := Config{AllowedLateness: 100, DedupeHorizon: 1000}
	s := mustNew(t, cfg)
	s.Offer(Event{Offset: 0, EventTime: 1000, EventID: "a", EntityID: "x", Size: 5})
	s.Offer(Event{Offset: 1, EventTime: 950, EventID: "b", EntityID: "y", Size: 6})
	return cfg, s.AppendSnapshot(nil)
}

func TestRestoreRejectsStructuralDamage(t *testing.T) {
	cfg, good := sampleSnapshot(t)
	// Layout of the sample: header 14, pending count 4, two events, id count 4, two ids, crc 4.
	const hdr = snapHeaderLen
	ev0 := hdr + 4
	ev0Len := eventMinLen + 1 + 1
	ev1 := ev0 + ev0Len
	idCount := ev1 + ev0Len
	ids0 := idCount + 4
	tests := []struct {
		name   string
		mutate func(b []byte) []byte
	}{
		{"wrong magic", func(b []byte) []byte { b[0] = 'X'; return b }},
		{"future version", func(b []byte) []byte { b[4] = 3; return b }},
		{"unknown flag", func(b []byte) []byte { b[5] |= 0x80; return b }},
		{"max seen without flag", func(b []byte) []byte { b[5] &^= flagHasMax; return b }},
		{"pending count too large", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[hdr:], 1<<30); return b }},
		{"pending count one short", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[hdr:], 1); return b }},
		{"events out of order", func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[ev1+8:], 900) // second event earlier than first (950)
			return b
		}},
		{"event after max seen", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[ev1+8:], 1001); return b }},
		{"string length past the end", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[ev0+36:], 1<<31); return b }},
		{"id count too large", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[idCount:], 3); return b }},
		{"same id twice", func(b []byte) []byte {
			copy(b[ids0+idEntryLen:ids0+idEntryLen+16], b[ids0:ids0+16])
			return b
		}},
		{"trailing byte", func(b []byte) []byte {
			return append(b[:len(b)-crcLen:len(b)-crcLen], 0, 0, 0, 0, 0)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bad := reseal(tt.mutate(slices.Clone(good)))
			if _, err := Restore(cfg, bad); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("err = %v, want ErrCorrupt", err)
			}
		})
	}
	if _, err := Restore(cfg, reseal(good)); err != nil {
		t.Fatalf("resealed good snapshot: %v", err)
	}
}

// FuzzRestore feeds arbitrary bytes to the decoder, both as they are and with a valid
// checksum appended so that the fuzzer gets past the CRC to the structural checks. A
// decoded stage must be usable and must round-trip.
func FuzzRestore(f *testing.F) {
	_, good := sampleSnapshot(f)
	f.Add(good)
	empty := mustNew(f, Config{}).AppendSnapshot(nil)
	f.Add(empty)
	r := rand.New(rand.NewPCG(1, 2))
	s := mustNew(f, Config{AllowedLateness: 100})
	for _, o := range genOps(r, 100, 100) {
		if o.kind == opOffer {
			s.Offer(o.ev)
		}
	}
	f.Add(s.AppendSnapshot(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg := Config{AllowedLateness: 100, DedupeHorizon: 1000}
		for _, in := range [][]byte{data, binary.LittleEndian.AppendUint32(slices.Clone(data), crc32.Checksum(data, castagnoli))} {
			st, err := Restore(cfg, in)
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("error %v does not wrap ErrCorrupt", err)
				}
				continue
			}
			snap := st.AppendSnapshot(nil)
			st2, err := Restore(cfg, snap)
			if err != nil {
				t.Fatalf("re-snapshot of an accepted input does not restore: %v", err)
			}
			if again := st2.AppendSnapshot(nil); !bytes.Equal(again, snap) {
				t.Fatal("snapshot not stable after a round trip")
			}
			n := st.Pending()
			out := st.FlushAll(nil)
			if len(out) != n || st.Pending() != 0 || st.PendingBytes() != 0 {
				t.Fatalf("flush of a restored stage: %d of %d out, %d left, %d bytes", len(out), n, st.Pending(), st.PendingBytes())
			}
			st.Offer(Event{Offset: 1, EventTime: 1, EventID: "z"})
		}
	})
}

// State that is not an event or an id also survives: the pressure flag (with its
// hysteresis) and the idle clock, which restarts at Restore rather than being stored.
func TestRestoreKeepsPressureAndRestartsIdleClock(t *testing.T) {
	clk := &fakeClock{t: time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)}
	cfg := Config{AllowedLateness: 1 << 20, HighEvents: 2, LowEvents: 1, IdleTimeout: time.Second, Now: clk.Now}
	s := mustNew(t, cfg)
	for i := range 3 {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: string(rune('a' + i)), Size: -5})
	}
	s.releaseN(1) // 2 pending: between the marks, still under pressure
	if !s.Pressure() || s.PendingBytes() != 0 {
		t.Fatalf("before snapshot: pressure %v, bytes %d; want true, 0 (negative sizes count 0)", s.Pressure(), s.PendingBytes())
	}
	clk.t = clk.t.Add(time.Hour)
	r, err := Restore(cfg, s.AppendSnapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Pressure() || r.Pending() != 2 {
		t.Fatalf("restored: pressure %v with %d pending; want true with 2", r.Pressure(), r.Pending())
	}
	if got := r.Idle(nil); len(got) != 0 {
		t.Fatalf("Idle right after Restore released %v; the clock should restart", ids(got))
	}
	clk.t = clk.t.Add(time.Second)
	if got := ids(r.Idle(nil)); !slices.Equal(got, []string{"b", "c"}) || r.Pressure() {
		t.Fatalf("Idle a timeout after Restore = %v, pressure %v; want [b c], false", got, r.Pressure())
	}
}

// TestSnapshotSkipsSupersededRemember: when Remember replaces a still-live
// entry of an id, the snapshot keeps only the current one, exactly as if the
// first had never been made.
func TestSnapshotSkipsSupersededRemember(t *testing.T) {
	cfg := Config{AllowedLateness: 1000}
	a, b := mustNew(t, cfg), mustNew(t, cfg)
	ev := Event{Offset: 1, EventTime: 10_000, EventID: "e1", EntityID: "c"}

	a.Offer(ev)
	a.Remember("x", 9_500)
	a.Remember("x", 9_800) // replaces a live entry: two live ring entries for x

	b.Offer(ev)
	b.Remember("x", 9_800)

	sa, sb := a.AppendSnapshot(nil), b.AppendSnapshot(nil)
	if !bytes.Equal(sa, sb) {
		t.Fatalf("snapshot kept the superseded entry: %d bytes, want %d", len(sa), len(sb))
	}
	r, err := Restore(cfg, sa)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.AppendSnapshot(nil); !bytes.Equal(got, sa) {
		t.Fatal("restored stage snapshots differently")
	}
}

// TestPendingSnapshotWhileStageGoesOn begins snapshots at many points of a long
// stream, finishes each on another goroutine while the stage goes on accepting and
// expiring thousands of ids (so blocks are popped, recycled and pushed meanwhile), and
// checks that every one is byte for byte what AppendSnapshot gave at its beginning.
// Run with -race: the finishing goroutine reads the id blocks the stage writes around.
func TestPendingSnapshotWhileStageGoesOn(t *testing.T) {
	for _, c := range []struct {
		name  string
		cfg   Config
		late  bool // Remember late ids, which makes the stage superseded (sync path)
		dedup bool
	}{
		{"dedupe", Config{AllowedLateness: 50, DedupeHorizon: 3000}, false, true},
		{"dedupe with remember", Config{AllowedLateness: 50, DedupeHorizon: 3000}, true, true},
		{"no dedupe", Config{AllowedLateness: 50, DisableDedupe: true}, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, 7))
			s := mustNew(t, c.cfg)
			var out []Event
			now := int64(0)
			off := int64(0)
			step := func(n int) {
				for range n {
					now += int64(r.IntN(3))
					ts := now - int64(r.IntN(80)) // some late, some out of order
					id := fmt.Sprintf("e%d", r.IntN(20000))
					s.Offer(Event{Offset: off, EventTime: ts, EventID: id, EntityID: "x", Size: 1})
					if c.late && r.IntN(50) == 0 {
						s.Remember(fmt.Sprintf("e%d", r.IntN(20000)), now-int64(r.IntN(2000)))
					}
					off++
					out = s.Ready(out[:0])
				}
			}
			for round := range 12 {
				step(1000 + r.IntN(9000))
				want := s.AppendSnapshot(nil)
				prefix := []byte("prefix")
				buf, p := s.BeginSnapshot(prefix)
				var got []byte
				if round%2 == 0 {
					// Finish after the stage went on: every block it reads had its
					// chance to be overwritten.
					step(5000)
					got = mustFinish(t, p, buf, len(prefix))
				} else {
					// Finish at the same time (for the race detector).
					done := make(chan []byte)
					go func() { b, _ := p.Finish(buf, len(prefix)); done <- b }()
					step(5000)
					got = <-done
				}
				s.EndSnapshot(p)
				if !bytes.Equal(got[len(prefix):], want) || string(got[:len(prefix)]) != "prefix" {
					t.Fatalf("round %d: deferred snapshot differs from AppendSnapshot at its beginning (%d vs %d bytes)", round, len(got)-len(prefix), len(want))
				}
				if _, err := Restore(c.cfg, got[len(prefix):]); err != nil {
					t.Fatalf("round %d: restore: %v", round, err)
				}
				if s.ring.views != 0 {
					t.Fatalf("round %d: %d views left open", round, s.ring.views)
				}
			}
			if c.dedup && s.ids.len() == 0 {
				t.Fatal("the stream left no ids: the test did not exercise the id list")
			}
		})
	}
}

func mustFinish(t testing.TB, p *PendingSnapshot, buf []byte, start int) []byte {
	t.Helper()
	b, err := p.Finish(buf, start)
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	return b
}

// Ext words travel through snapshots with their events, and a stage whose events
// carry none writes exactly the bytes it wrote before Ext existed (no flag, no
// per-event length), so snapshots of the default definition do not change.
func TestSnapshotCarriesExt(t *testing.T) {
	cfg := Config{AllowedLateness: 100, DedupeHorizon: 1000}
	_, without := sampleSnapshot(t)
	if without[5]&flagExt != 0 {
		t.Fatalf("flags %#x: ext flag set with no Ext words", without[5])
	}

	s := mustNew(t, cfg)
	s.Offer(Event{Offset: 0, EventTime: 1000, EventID: "a", EntityID: "x", Size: 5, Ext: []uint64{0b101, 1<<63 | 7}})
	s.Offer(Event{Offset: 1, EventTime: 950, EventID: "b", EntityID: "y", Size: 6}) // none: length 0
	s.Offer(Event{Offset: 2, EventTime: 960, EventID: "c", EntityID: "y", Size: 6, Ext: []uint64{1}})
	snap := s.AppendSnapshot(nil)
	if snap[5]&flagExt == 0 {
		t.Fatalf("flags %#x: ext flag missing", snap[5])
	}
	r, err := Restore(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	if again := r.AppendSnapshot(nil); !bytes.Equal(again, snap) {
		t.Fatal("a restored stage snapshots to other bytes")
	}
	got := r.FlushAll(nil)
	want := map[int64][]uint64{0: {0b101, 1<<63 | 7}, 1: nil, 2: {1}}
	if len(got) != 3 {
		t.Fatalf("flushed %d events, want 3", len(got))
	}
	for _, ev := range got {
		if !slices.Equal(ev.Ext, want[ev.Offset]) {
			t.Errorf("offset %d: Ext %v, want %v", ev.Offset, ev.Ext, want[ev.Offset])
		}
	}
	// A truncated ext word is corruption, not a short slice.
	cut := reseal(snap[:len(snap)-crcLen-4-3*idEntryLen-4])
	if _, err := Restore(cfg, cut); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("truncated ext: %v, want ErrCorrupt", err)
	}
}
