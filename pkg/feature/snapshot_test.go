package feature

import (
	"encoding/binary"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// sampleState is a State after a seeded stream: filtered tables, exact and sampled
// sets. It returns the unfiltered table's snapshot and the extras.
func sampleState(t testing.TB, events int) (Spec, []byte, []byte) {
	t.Helper()
	spec := testSpec(t)
	st, err := NewState(spec, window.Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := newStreamGen(21, 12)
	row := NewRow(&spec)
	for range events {
		id, _, ts, a, ext := g.next()
		st.Apply(id, ts, a, ext, row)
	}
	return spec, st.Table().AppendSnapshot(nil), st.AppendExtras(nil)
}

func restoreFrom(spec Spec, tb, ex []byte) (*State, error) {
	base, err := window.RestoreTable(spec.Windows, window.Options{}, tb)
	if err != nil {
		return nil, err
	}
	return Restore(spec, window.Options{}, base, ex)
}

// reseal replaces the trailing checksum, so that a test reaches the checks behind it.
func reseal(b []byte) []byte {
	body := b[:len(b)-4]
	return binary.LittleEndian.AppendUint32(append([]byte(nil), body...), crc32.Checksum(body, crcTable))
}

func TestExtrasRejectGarbage(t *testing.T) {
	spec, tb, ex := sampleState(t, 3000)
	if _, err := restoreFrom(spec, tb, ex); err != nil {
		t.Fatal(err)
	}
	for n := range len(ex) {
		if _, err := restoreFrom(spec, tb, ex[:n]); err == nil {
			t.Fatalf("extras truncated to %d of %d bytes restored", n, len(ex))
		}
	}
	for i := range len(ex) - 4 {
		b := append([]byte(nil), ex...)
		b[i] ^= 0x20
		if _, err := restoreFrom(spec, tb, b); err == nil {
			t.Fatalf("byte %d flipped: restored", i)
		}
	}
	// Content errors behind a valid checksum, every byte of the body in turn: none
	// may panic; most must fail (a few flips are still a valid, different state).
	failed := 0
	for i := 4; i < len(ex)-4; i++ {
		b := append([]byte(nil), ex...)
		b[i] ^= 0x01
		if _, err := restoreFrom(spec, tb, reseal(b)); err != nil {
			failed++
		}
	}
	if failed < (len(ex)-8)/2 {
		t.Errorf("only %d of %d resealed one-bit changes were refused", failed, len(ex)-8)
	}
	// Another spec (one feature renamed) cannot restore these extras.
	other := testSpec(t)
	other.Features[0].Name = "count2"
	if _, err := restoreFrom(other, tb, ex); err == nil || !strings.Contains(err.Error(), "different feature spec") {
		t.Errorf("another spec: %v", err)
	}
	// Extras whose entities the unfiltered table does not hold (trimmed by a smaller
	// cap) restore without them.
	emptyBase, _ := window.NewTable(spec.Windows, window.Options{})
	st, err := Restore(spec, window.Options{}, emptyBase, ex)
	if err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, st)
	for _, ft := range st.ftabs {
		if ft.tbl.Len() != 0 {
			t.Errorf("filter %d kept %d entities the unfiltered table lacks", ft.bit, ft.tbl.Len())
		}
	}
}

// TestRestoreCapTrim: the unfiltered table restored with a smaller cap drops its
// least recently active entities, and the extras follow.
func TestRestoreCapTrim(t *testing.T) {
	spec := testSpec(t)
	opts := window.Options{MaxEntities: 12}
	st, _ := NewState(spec, opts)
	g := newStreamGen(5, 12)
	row := NewRow(&spec)
	for range 3000 {
		id, _, ts, a, ext := g.next()
		st.Apply(id, ts, a, ext, row)
	}
	small := window.Options{MaxEntities: 4}
	base, err := window.RestoreTable(spec.Windows, small, st.Table().AppendSnapshot(nil))
	if err != nil {
		t.Fatal(err)
	}
	st2, err := Restore(spec, small, base, st.AppendExtras(nil))
	if err != nil {
		t.Fatal(err)
	}
	if st2.Table().Len() != 4 {
		t.Fatalf("%d entities, want 4", st2.Table().Len())
	}
	checkInvariants(t, st2)
}

func FuzzRestoreExtras(f *testing.F) {
	spec, tb, ex := sampleState(f, 2000)
	f.Add(ex)
	_, _, ex2 := sampleState(f, 50)
	f.Add(ex2)
	f.Add([]byte("VFX\x01"))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, b := range [][]byte{data, func() []byte {
			if len(data) < 4 {
				return data
			}
			return reseal(data) // reach the checks behind the checksum
		}()} {
			st, err := restoreFrom(spec, tb, b)
			if err != nil {
				continue
			}
			checkInvariants(t, st)
			again := st.AppendExtras(nil)
			st2, err := restoreFrom(spec, tb, again)
			if err != nil {
				t.Fatalf("re-encoded extras do not restore: %v", err)
			}
			if string(st2.AppendExtras(nil)) != string(again) {
				t.Fatal("restore and re-encode is not stable")
			}
			// A restored state must go on working.
			row := NewRow(&spec)
			g := newStreamGen(1, 12)
			for range 50 {
				id, _, ts, a, ext := g.next()
				st.Apply(id, ts+1e9, a, ext, row)
			}
			checkInvariants(t, st)
		}
	})
}

// TestExtrasInSteps: a snapshot taken in steps while the State goes on (events for
// old and new entities, cap evictions, idle sweeps) gives exactly the bytes of the
// snapshot taken at once when it began, and restores with the table snapshot taken
// at the same point to a State that goes on as the original would have.
func TestExtrasInSteps(t *testing.T) {
	spec := testSpec(t)
	for _, budget := range []int{1, 7, 100} {
		opts := window.Options{MaxEntities: 30}
		st, _ := NewState(spec, opts)
		g := newStreamGen(uint64(budget), 60)
		row := NewRow(&spec)
		for range 5000 {
			id, _, ts, a, ext := g.next()
			st.Apply(id, ts, a, ext, row)
		}
		want := st.AppendExtras(nil)
		wantTable := st.Table().AppendSnapshot(nil)
		tp := st.Table().BeginSnapshot()
		ps := st.BeginExtras()
		steps := 0
		for i := 0; ; i++ {
			tDone := tp.Step(budget)
			if ps.Step(budget) && tDone {
				break
			}
			steps++
			for range 5 {
				id, _, ts, a, ext := g.next()
				st.Apply(id, ts, a, ext, row)
			}
			if i%20 == 19 {
				st.EvictIdle(g.now - g.maxDelay)
			}
		}
		got := ps.AppendTo(nil)
		gotTable := tp.AppendTo(nil)
		st.Table().EndSnapshot(tp)
		st.EndExtras(ps)
		if string(got) != string(want) || string(gotTable) != string(wantTable) {
			t.Fatalf("budget %d (%d steps): the snapshot in steps differs from the one at its start", budget, steps)
		}
		if budget == 1 && steps < 10 {
			t.Fatalf("only %d steps: the test did not interleave", steps)
		}
		base, err := window.RestoreTable(spec.Windows, opts, gotTable)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Restore(spec, opts, base, got); err != nil {
			t.Fatal(err)
		}
		// The State goes on; a second snapshot right away is complete at once.
		if again := st.AppendExtras(nil); len(again) == 0 {
			t.Fatal("empty snapshot")
		}
		checkInvariants(t, st)
	}
}
