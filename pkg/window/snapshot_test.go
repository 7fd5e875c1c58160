package window

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"
)

// sampleTable holds every entity shape: raw, rings, header-only.
func sampleTable(t testing.TB, opts Options) *Table {
	t.Helper()
	tbl := mustTable(t, "10s:1s,1m:10s", opts)
	out := make([]Agg, 2)
	makeBusy(t, tbl, "busy", 1_000)
	for i, id := range []string{"raw-b", "raw-a", "gone"} {
		if _, _, err := tbl.Apply(id, int64(2000+i*100), int64(10*i), out); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := tbl.Apply("busy", 9_000, 7, out); err != nil {
		t.Fatal(err)
	}
	tbl.EvictIdle(2_000) // nothing empty yet
	if _, _, err := tbl.Apply("header", -200_000, 3, out); err != nil {
		t.Fatal(err)
	}
	tbl.EvictIdle(0) // shrinks "header" only
	return tbl
}

func TestSnapshotRoundTripIsDeterministic(t *testing.T) {
	for _, opts := range []Options{{}, {MaxEntities: 10}} {
		a := sampleTable(t, opts)
		snap := a.AppendSnapshot([]byte("prefix"))
		if !bytes.HasPrefix(snap, []byte("prefix")) {
			t.Fatal("AppendSnapshot did not append")
		}
		snap = snap[len("prefix"):]
		if again := a.AppendSnapshot(nil); !bytes.Equal(again, snap) {
			t.Fatal("two snapshots of the same state differ")
		}
		input := bytes.Clone(snap)
		b, err := RestoreTable(a.Specs(), opts, input)
		if err != nil {
			t.Fatal(err)
		}
		clear(input) // the caller may reuse its buffer: the table must own its ids
		if got := b.AppendSnapshot(nil); !bytes.Equal(got, snap) {
			t.Fatal("restored table encodes differently (or still aliases the input)")
		}
		// Both tables must behave identically afterwards.
		outA, outB := make([]Agg, 2), make([]Agg, 2)
		for i, id := range []string{"busy", "raw-a", "header", "new", "raw-b"} {
			at := int64(9_500 + i)
			ga, pa, ea := a.Apply(id, at, 1, outA)
			gb, pb, eb := b.Apply(id, at, 1, outB)
			if ga != gb || pa != pb || (ea == nil) != (eb == nil) || outA[0] != outB[0] || outA[1] != outB[1] {
				t.Fatalf("%s after restore: %v %d %v %v vs %v %d %v %v", id, outA, ga, pa, ea, outB, gb, pb, eb)
			}
		}
	}
}

func TestSnapshotSameStateSameBytesRegardlessOfHistory(t *testing.T) {
	// Same entities and events, created in a different order, with an eviction and
	// re-creation in between: the logical state is equal, so the bytes must be.
	a := mustTable(t, "10s:1s", Options{})
	b := mustTable(t, "10s:1s", Options{HistoryTTLMs: 1})
	out := make([]Agg, 1)
	for _, id := range []string{"x", "y", "z"} {
		a.Apply(id, 100, 1, out)
	}
	b.Apply("old", -1_000_000, 1, out)
	for _, id := range []string{"z", "y", "x"} {
		b.Apply(id, 100, 1, out)
	}
	if b.EvictIdle(1) != 1 {
		t.Fatal("expected to evict old")
	}
	if !bytes.Equal(a.AppendSnapshot(nil), b.AppendSnapshot(nil)) {
		t.Fatal("equal state, different snapshot bytes")
	}
}

func TestRestoreRejectsDamage(t *testing.T) {
	tbl := sampleTable(t, Options{})
	snap := tbl.AppendSnapshot(nil)
	specs := tbl.Specs()
	for n := range len(snap) {
		if _, err := RestoreTable(specs, Options{}, snap[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: restored", n, len(snap))
		}
	}
	for i := range snap {
		for _, bit := range []byte{0x01, 0x80} {
			bad := bytes.Clone(snap)
			bad[i] ^= bit
			if _, err := RestoreTable(specs, Options{}, bad); err == nil {
				t.Fatalf("flipped bit %#x of byte %d: restored", bit, i)
			}
		}
	}
	if _, err := RestoreTable(specs, Options{}, append(bytes.Clone(snap), 0)); err == nil {
		t.Fatal("trailing byte accepted")
	}
	other, _ := ParseSpecs("10s:1s,1m:20s")
	if _, err := RestoreTable(other, Options{}, snap); err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Fatalf("spec mismatch: %v", err)
	}
	fewer, _ := ParseSpecs("10s:1s")
	if _, err := RestoreTable(fewer, Options{}, snap); err == nil {
		t.Fatal("restored into fewer windows")
	}
}

func TestRestoreOverCapKeepsMostRecent(t *testing.T) {
	tbl := mustTable(t, "10s:1s", Options{MaxEntities: 5})
	out := make([]Agg, 1)
	for i, id := range []string{"a", "b", "c", "d"} {
		tbl.Apply(id, int64(i), 1, out)
	}
	small, err := RestoreTable(tbl.Specs(), Options{MaxEntities: 2}, tbl.AppendSnapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	small.Range(func(id string, _ int64, _ []Agg) bool { ids = append(ids, id); return true })
	if strings.Join(ids, ",") != "c,d" || small.CapEvictions() != 2 {
		t.Fatalf("kept %v, evictions %d; want c,d and 2", ids, small.CapEvictions())
	}
}

// withCRC recomputes the trailer so the fuzzer's mutations reach the parser instead
// of stopping at the checksum.
func withCRC(b []byte) []byte {
	if len(b) < 4 {
		return b
	}
	body := b[:len(b)-4]
	return binary.LittleEndian.AppendUint32(bytes.Clone(body), crc32.Checksum(body, crcTable))
}

func FuzzRestoreTable(f *testing.F) {
	tbl := sampleTable(f, Options{})
	specs := tbl.Specs()
	f.Add(tbl.AppendSnapshot(nil))
	empty := mustTable(f, "10s:1s,1m:10s", Options{})
	f.Add(empty.AppendSnapshot(nil))
	r := rand.New(rand.NewPCG(1, 2))
	for _, ev := range genStream(r, 300, 10_000, 60_000, 4) {
		empty.Apply(ev.id, ev.t, ev.a, make([]Agg, 2))
	}
	f.Add(empty.AppendSnapshot(nil))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, in := range [][]byte{data, withCRC(data)} {
			got, err := RestoreTable(specs, Options{MaxEntities: 3}, in)
			if err != nil {
				continue
			}
			// Whatever was accepted must be a table the engine can run on and that
			// round-trips.
			snap := got.AppendSnapshot(nil)
			again, err := RestoreTable(specs, Options{MaxEntities: 3}, snap)
			if err != nil {
				t.Fatalf("re-restore of accepted snapshot: %v", err)
			}
			if !bytes.Equal(again.AppendSnapshot(nil), snap) {
				t.Fatal("accepted snapshot does not round-trip")
			}
			out := make([]Agg, 2)
			got.Range(func(id string, last int64, _ []Agg) bool {
				got.Apply(id, last, 1, out)
				got.Apply(id, last-5_000, 1, out)
				got.Apply(id, last+30_000, 1, out)
				return true
			})
			got.EvictIdle(1 << 40)
		}
	})
}

// TestSnapshotFinishedLater begins snapshots, takes them in small steps while the
// table goes on (new entities, growing rings, expiry, cap and idle evictions, freed
// slots reused), and only then finishes them, as a background checkpoint does: each
// must be exactly what AppendSnapshot gave at its beginning. Several rounds reuse the
// buffers handed back by EndSnapshot.
func TestSnapshotFinishedLater(t *testing.T) {
	// A short history TTL makes EvictIdle free slots, so that some are free at
	// BeginSnapshot and taken by new entities before Step reaches them.
	for _, opts := range []Options{{HistoryTTLMs: 1000}, {MaxEntities: 300, HistoryTTLMs: 1000}} {
		r := rand.New(rand.NewPCG(5, 5))
		tbl := mustTable(t, "10s:1s,1m:10s", opts)
		out := make([]Agg, 2)
		now := int64(0)
		step := func(n int) {
			for range n {
				now += int64(r.IntN(50))
				id := fmt.Sprintf("e%d", r.IntN(500))
				if _, _, err := tbl.Apply(id, now-int64(r.IntN(500)), int64(r.IntN(1000)), out); err != nil && !errors.Is(err, ErrExpired) {
					t.Fatal(err)
				}
				if r.IntN(50) == 0 {
					tbl.EvictIdle(now - 30_000)
				}
			}
		}
		for round := range 6 {
			step(2000)
			want := tbl.AppendSnapshot(nil)
			ts := tbl.BeginSnapshot()
			// A few entities at a time between events, as the pipeline does, so
			// that many entities are changed, evicted or replaced before Step
			// reaches them and must be kept as they were.
			budget := 1 + round*3
			for !ts.Step(budget) {
				step(20)
			}
			step(500)
			got := ts.AppendTo([]byte("p"))
			tbl.EndSnapshot(ts)
			if string(got[:1]) != "p" || !bytes.Equal(got[1:], want) {
				t.Fatalf("opts %+v round %d: snapshot finished later differs from AppendSnapshot at its beginning", opts, round)
			}
			if _, err := RestoreTable(tbl.Specs(), opts, got[1:]); err != nil {
				t.Fatalf("opts %+v round %d: %v", opts, round, err)
			}
		}
	}
}
