package watermark

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// memSegments is a SegmentStore in a map, counting what was written.
type memSegments struct {
	mu      sync.Mutex
	segs    map[string][]byte
	next    int
	written int
	failPut error
}

func newMemSegments() *memSegments { return &memSegments{segs: map[string][]byte{}} }

func (m *memSegments) PutSegment(data []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failPut != nil {
		return nil, m.failPut
	}
	m.next++
	ref := fmt.Appendf(nil, "seg-%d", m.next)
	m.segs[string(ref)] = slices.Clone(data)
	m.written += len(data)
	return ref, nil
}

var errNoSegment = errors.New("no such segment")

func (m *memSegments) GetSegment(ref []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.segs[string(ref)]
	if !ok {
		return nil, errNoSegment
	}
	return b, nil
}

func (m *memSegments) delete(refs [][]byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range refs {
		delete(m.segs, string(r))
	}
}

func (m *memSegments) keys() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.segs))
}

// segmentedCheckpoint takes a segmented snapshot as the service does: begin, let
// the stage go on (step), finish, end, then report it saved and delete the garbage.
func segmentedCheckpoint(t *testing.T, s *Stage, store *memSegments, step func()) []byte {
	t.Helper()
	buf, p := s.BeginSnapshot(nil)
	if step != nil {
		step()
	}
	snap := mustFinish(t, p, buf, 0)
	s.EndSnapshot(p)
	store.delete(s.SnapshotSaved(p))
	return snap
}

func refsOf(t *testing.T, cfg Config, snap []byte) []string {
	t.Helper()
	st, err := Restore(cfg, snap)
	if err != nil {
		t.Fatalf("restore to list refs: %v", err)
	}
	var out []string
	for _, g := range st.segSaved {
		out = append(out, string(g.ref))
	}
	return out
}

// TestSegmentedSnapshotsRestoreTheSameState drives a stage through a stream with
// expiry, duplicates and disorder, taking a segmented snapshot every round. Each
// must restore to exactly the state an inline (version 1) snapshot taken at the
// same moment holds; the store must keep exactly the segments the two newest
// snapshots list; and the bytes written must be far below rewriting every id.
// With a merge cap, no merged segment may pass it, and the list may grow past
// segFanIn−1 segments per level only as far as the cap forces.
func TestSegmentedSnapshotsRestoreTheSameState(t *testing.T) {
	for _, c := range []struct {
		name     string
		horizon  int64
		rounds   int
		minIDs   int // live at the end: the id list was exercised
		maxMerge int // Config.MaxMergeBytes; 0 = the default, far above these tests
		capped   bool
		maxIDs   int // Config.MaxDedupeIDs
	}{
		{"ids expire within a few rounds", 4000, 60, 4000, 0, false, 0},
		{"horizon longer than the run", 1 << 40, 60, 30000, 0, false, 0},
		// About 900 ids a round: level-1 merges (about 3 600 ids) fit under a
		// cap of 10 000 ids, level-2 merges do not.
		{"merges capped, ids expire", 4000, 60, 4000, 10000 * idEntryLen, false, 0},
		{"merges capped, horizon longer than the run", 1 << 40, 60, 30000, 10000 * idEntryLen, true, 0},
		// The set held at 8 000 ids by MaxDedupeIDs: the front goes as the cap pushes
		// it, not the horizon, and the segments still follow.
		{"ids capped by MaxDedupeIDs", 1 << 40, 60, 8000, 0, false, 8000},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := newMemSegments()
			cfg := Config{AllowedLateness: 50, DedupeHorizon: c.horizon, Segments: store, MaxMergeBytes: c.maxMerge, MaxDedupeIDs: c.maxIDs}
			s := mustNew(t, cfg)
			r := rand.New(rand.NewPCG(3, 9))
			now, off := int64(0), int64(0)
			var out []Event
			step := func(n int) {
				for range n {
					now += int64(r.IntN(2))
					ts := now - int64(r.IntN(80))
					s.Offer(Event{Offset: off, EventTime: ts, EventID: fmt.Sprintf("e%d", r.IntN(1_000_000)), EntityID: "x", Size: 1})
					off++
					out = s.Ready(out[:0])
				}
			}
			var prevRefs []string
			inline := 0
			sawCapped := false
			for round := range c.rounds {
				step(200 + r.IntN(800))
				want := s.AppendSnapshot(nil)
				inline += len(want)
				snap := segmentedCheckpoint(t, s, store, func() { step(300) })
				if snap[len(snapMagic)] != snapVersion2 {
					t.Fatalf("round %d: version %d, want the segmented %d", round, snap[len(snapMagic)], snapVersion2)
				}
				st, err := Restore(cfg, snap)
				if err != nil {
					t.Fatalf("round %d: restore: %v", round, err)
				}
				if got := st.AppendSnapshot(nil); !bytes.Equal(got, want) {
					t.Fatalf("round %d: restored state differs from the stage's at the snapshot (%d vs %d inline bytes)", round, len(got), len(want))
				}
				list := st.segSaved // the restore above read the snapshot's list
				var refs []string
				listed := uint64(0)
				for _, g := range list {
					refs = append(refs, string(g.ref))
					listed += g.count
					if c.maxMerge > 0 && g.level > 0 && g.level < segTopLevel && g.count*idEntryLen > uint64(c.maxMerge) {
						t.Fatalf("round %d: a merged segment (level %d) of %d bytes passes the cap of %d", round, g.level, g.count*idEntryLen, c.maxMerge)
					}
				}
				// Any segFanIn adjacent segments of one level hold more than the
				// cap (else they would have merged), hence the first term.
				limit := (segFanIn-1)*12 + 1
				if c.maxMerge > 0 {
					limit += segFanIn * int(listed*idEntryLen/uint64(c.maxMerge))
				}
				if len(refs) > limit {
					t.Fatalf("round %d: %d segments listed, more than %d", round, len(refs), limit)
				}
				if run := longestLevelRun(list); run >= segFanIn {
					if !c.capped {
						t.Fatalf("round %d: %d adjacent segments of one level: a merge was skipped", round, run)
					}
					sawCapped = true
				}
				kept := slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(refs), prevRefs...))))
				if got := store.keys(); !slices.Equal(got, kept) {
					t.Fatalf("round %d: store keeps %v, the two newest snapshots list %v", round, got, kept)
				}
				prevRefs = refs
			}
			if s.ids.len() < c.minIDs {
				t.Fatalf("only %d live ids: the test did not exercise the id list", s.ids.len())
			}
			if c.maxIDs > 0 && (s.DedupeIDs() > c.maxIDs || s.DedupeCapEvictions() == 0) {
				t.Fatalf("%d ids, %d evicted by the cap of %d", s.DedupeIDs(), s.DedupeCapEvictions(), c.maxIDs)
			}
			if c.capped && !sawCapped {
				t.Fatalf("the cap of %d bytes never stopped a merge: the test did not exercise it", c.maxMerge)
			}
			// Each id is written about log_4(rounds) times, not once per round.
			if store.written*4 > inline {
				t.Fatalf("segments wrote %d bytes, inline snapshots would write %d: not incremental", store.written, inline)
			}
			t.Logf("%d rounds: segments wrote %d bytes, inline snapshots %d", c.rounds, store.written, inline)
		})
	}
}

// longestLevelRun is the longest run of adjacent segments of one level in list.
func longestLevelRun(list []segment) int {
	best, run := 0, 0
	for i, g := range list {
		if i > 0 && list[i-1].level == g.level {
			run++
		} else {
			run = 1
		}
		best = max(best, run)
	}
	return best
}

// TestSegmentedRestoreStartsAFreshList: the owner that restores a segmented
// snapshot writes its own whole-set segment first and releases the restored
// list's segments two saves later, when no snapshot the store keeps needs them.
func TestSegmentedRestoreStartsAFreshList(t *testing.T) {
	store := newMemSegments()
	cfg := Config{DedupeHorizon: 1 << 40, Segments: store}
	s := mustNew(t, cfg)
	for i := range 3000 {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: fmt.Sprint(i), EntityID: "x"})
		if i%500 == 499 {
			segmentedCheckpoint(t, s, store, nil)
		}
	}
	snap := segmentedCheckpoint(t, s, store, nil)
	inherited := refsOf(t, cfg, snap)
	if len(inherited) < 2 {
		t.Fatalf("only %d segments to inherit", len(inherited))
	}
	st, err := Restore(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	has := func(ref string) bool { return slices.Contains(store.keys(), ref) }
	st.Offer(Event{Offset: 5000, EventTime: 5000, EventID: "new", EntityID: "x"})
	first := segmentedCheckpoint(t, st, store, nil)
	if refs := refsOf(t, cfg, first); len(refs) != 1 || slices.Contains(inherited, refs[0]) {
		t.Fatalf("first snapshot after restore lists %v, want one new whole-set segment", refs)
	}
	for _, ref := range inherited {
		if !has(ref) {
			t.Fatalf("inherited segment %s deleted while the store still keeps the snapshot that lists it", ref)
		}
	}
	st.Offer(Event{Offset: 5001, EventTime: 5001, EventID: "newer", EntityID: "x"})
	segmentedCheckpoint(t, st, store, nil)
	for _, ref := range inherited {
		if has(ref) {
			t.Fatalf("inherited segment %s kept after two saves of the new owner", ref)
		}
	}
	// A duplicate of an id from the inherited segments is still caught.
	if v := st.Offer(Event{Offset: 5002, EventTime: 5002, EventID: "7", EntityID: "x"}); v != Duplicate {
		t.Fatalf("id from an inherited segment: %v, want duplicate", v)
	}
}

// TestSegmentedRestoreWritesCappedPieces: the new owner's first snapshot writes
// every live id again, in pieces of at most the merge cap (one piece would need
// a buffer of the whole set and stay listed until its last id expires). The
// snapshot restores exactly, and the oldest pieces leave the list (and the
// store) as their ids leave the horizon.
func TestSegmentedRestoreWritesCappedPieces(t *testing.T) {
	const capIDs = 700
	store := newMemSegments()
	cfg := Config{DedupeHorizon: 4000, Segments: store, MaxMergeBytes: capIDs * idEntryLen}
	s := mustNew(t, cfg)
	next := 0
	offer := func(st *Stage, n int) {
		for range n {
			st.Offer(Event{Offset: int64(next), EventTime: int64(next), EventID: fmt.Sprint(next), EntityID: "x"})
			next++
		}
	}
	offer(s, 3000)
	snap := segmentedCheckpoint(t, s, store, nil)
	st, err := Restore(cfg, snap)
	if err != nil {
		t.Fatal(err)
	}
	offer(st, 10)
	want := st.AppendSnapshot(nil)
	first := segmentedCheckpoint(t, st, store, nil)
	got, err := Restore(cfg, first)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.AppendSnapshot(nil), want) {
		t.Fatal("the first snapshot after the restore does not restore the state it was taken of")
	}
	pieces := got.segSaved
	if len(pieces) != (3010+capIDs-1)/capIDs {
		t.Fatalf("%d segments for 3 010 ids at %d ids a piece", len(pieces), capIDs)
	}
	for _, g := range pieces {
		if g.count > capIDs || g.level != segTopLevel {
			t.Fatalf("piece %d+%d at level %d: more than the cap, or not a whole-set piece", g.first, g.count, g.level)
		}
	}
	// 2 000 more ids: the horizon (4 000 of event time) passes the first
	// pieces' ids, and they leave the list, then the store.
	offer(st, 2000)
	segmentedCheckpoint(t, st, store, nil)
	offer(st, 10)
	last := segmentedCheckpoint(t, st, store, nil)
	listed := refsOf(t, cfg, last)
	if slices.Contains(listed, string(pieces[0].ref)) || slices.Contains(store.keys(), string(pieces[0].ref)) {
		t.Fatalf("the oldest piece, all of whose ids expired, is still listed or stored")
	}
	if !slices.Contains(listed, string(pieces[len(pieces)-1].ref)) {
		t.Fatalf("the newest piece, whose ids are live, left the list")
	}
}

// TestSegmentedRestoreFailures: a missing or damaged segment, or no store to read
// from, fails the restore with an error; never a stage with ids missing.
func TestSegmentedRestoreFailures(t *testing.T) {
	store := newMemSegments()
	cfg := Config{DedupeHorizon: 1 << 40, Segments: store}
	s := mustNew(t, cfg)
	for i := range 100 {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i), EventID: fmt.Sprint(i), EntityID: "x"})
	}
	snap := segmentedCheckpoint(t, s, store, nil)
	ref := refsOf(t, cfg, snap)[0]
	good := store.segs[ref]
	for _, c := range []struct {
		name    string
		cfg     Config
		segment []byte // nil: missing
		want    error
	}{
		{"missing segment", cfg, nil, errNoSegment},
		{"flipped bit", cfg, flip(good, segHeadLen+3), ErrCorrupt},
		{"truncated", cfg, good[:len(good)-idEntryLen], ErrCorrupt},
		{"other range", cfg, resealSegment(good, func(b []byte) { binary.LittleEndian.PutUint64(b[len(segMagic)+1:], 1) }), ErrCorrupt},
		{"no store given", Config{DedupeHorizon: 1 << 40}, good, ErrCorrupt},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.segment == nil {
				delete(store.segs, ref)
			} else {
				store.segs[ref] = c.segment
			}
			_, err := Restore(c.cfg, snap)
			if !errors.Is(err, c.want) {
				t.Fatalf("restore: %v, want %v", err, c.want)
			}
			// A segment that cannot be used is told apart from a bad snapshot.
			if fromStore := c.cfg.Segments != nil; errors.Is(err, ErrSegment) != fromStore {
				t.Fatalf("restore: %v: ErrSegment %v, want %v", err, errors.Is(err, ErrSegment), fromStore)
			}
		})
	}
	// A failed segment write fails Finish, so that snapshot is never saved.
	store.failPut = errors.New("disk full")
	s.Offer(Event{Offset: 200, EventTime: 200, EventID: "late one", EntityID: "x"})
	buf, p := s.BeginSnapshot(nil)
	if _, err := p.Finish(buf, 0); !errors.Is(err, store.failPut) {
		t.Fatalf("Finish with a failing store: %v", err)
	}
	s.EndSnapshot(p)
}

func flip(b []byte, i int) []byte {
	b = slices.Clone(b)
	b[i] ^= 1
	return b
}

func resealSegment(b []byte, mutate func([]byte)) []byte {
	b = slices.Clone(b)
	mutate(b)
	return reseal(b)
}

// FuzzRestoreSegmented mutates a segmented snapshot and its segment: Restore
// never panics, fails only with an error, and what it accepts round-trips.
func FuzzRestoreSegmented(f *testing.F) {
	store := newMemSegments()
	cfg := Config{AllowedLateness: 10, DedupeHorizon: 1000, Segments: store}
	s := mustNew(f, cfg)
	for i := range 50 {
		s.Offer(Event{Offset: int64(i), EventTime: int64(i * 10), EventID: fmt.Sprint(i), EntityID: "x"})
	}
	buf, p := s.BeginSnapshot(nil)
	snap, err := p.Finish(buf, 0)
	if err != nil {
		f.Fatal(err)
	}
	seg := store.segs["seg-1"]
	f.Add(snap, seg)
	f.Fuzz(func(t *testing.T, snap, seg []byte) {
		st := newMemSegments()
		st.segs["seg-1"] = seg
		cfg := cfg
		cfg.Segments = st
		for _, in := range [][]byte{snap, reseal(append(slices.Clone(snap), 0, 0, 0, 0))} {
			for _, sg := range [][]byte{seg, reseal(append(slices.Clone(seg), 0, 0, 0, 0))} {
				st.segs["seg-1"] = sg
				stage, err := Restore(cfg, in)
				if err != nil {
					continue
				}
				again := stage.AppendSnapshot(nil)
				st2, err := Restore(Config{AllowedLateness: 10, DedupeHorizon: 1000}, again)
				if err != nil {
					t.Fatalf("inline snapshot of an accepted input does not restore: %v", err)
				}
				if !bytes.Equal(st2.AppendSnapshot(nil), again) {
					t.Fatal("snapshot not stable after a round trip")
				}
			}
		}
	})
}
