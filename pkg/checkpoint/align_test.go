package checkpoint

import "testing"

func TestForCommitted(t *testing.T) {
	snap := func(next int64, seq uint64) Snapshot {
		return Snapshot{Next: next, State: []byte{byte(next), byte(seq)}, Epoch: 1 << 32, Seq: seq}
	}
	prev := func(next int64, seq uint64) *Snapshot { s := snap(next, seq); return &s }
	id := func(seq uint64) ID { return ID{Epoch: 1 << 32, Seq: seq} }
	for _, tc := range []struct {
		name      string
		loaded    Loaded
		committed int64
		id        ID
		hasID     bool
		wantNext  int64
		wantSeq   uint64
		stepBack  bool
		ok        bool
	}{
		{"newest matches the committed transaction", Loaded{Snapshot: snap(20, 2), Previous: prev(10, 1)}, 20, id(2), true, 20, 2, false, true},
		{"crash between save and commit: step back", Loaded{Snapshot: snap(30, 3), Previous: prev(20, 2)}, 20, id(2), true, 20, 2, true, true},
		// An idle release published the reorder buffer's tail after the
		// input stopped: the newest snapshot has the same Next as the
		// committed one, and its transaction did not commit.
		{"same offset, newest uncommitted: step back by id", Loaded{Snapshot: snap(20, 3), Previous: prev(20, 2)}, 20, id(2), true, 20, 2, true, true},
		{"same offset, newest committed", Loaded{Snapshot: snap(20, 3), Previous: prev(20, 2)}, 20, id(3), true, 20, 3, false, true},
		{"a commit without an id matches by offset", Loaded{Snapshot: snap(30, 3), Previous: prev(20, 2)}, 20, ID{}, false, 20, 2, true, true},
		{"offset matches, id names neither", Loaded{Snapshot: snap(20, 3), Previous: prev(20, 2)}, 20, id(9), true, 0, 0, false, false},
		{"newest corrupt, the previous matches", Loaded{Snapshot: snap(20, 2), FellBack: true}, 20, id(2), true, 20, 2, false, true},
		{"newest ahead and no previous", Loaded{Snapshot: snap(30, 3)}, 20, id(2), true, 0, 0, false, false},
		{"both ahead of the commit", Loaded{Snapshot: snap(40, 4), Previous: prev(30, 3)}, 20, id(2), true, 0, 0, false, false},
		{"snapshot behind the commit (store lost or mode switched)", Loaded{Snapshot: snap(10, 1), Previous: prev(5, 0)}, 20, id(2), true, 0, 0, false, false},
		{"nothing committed yet", Loaded{Snapshot: snap(10, 1)}, -1, ID{}, false, 0, 0, false, false},
		{"committed zero with a matching snapshot", Loaded{Snapshot: snap(0, 1)}, 0, id(1), true, 0, 1, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, stepBack, ok := ForCommitted(tc.loaded, tc.committed, tc.id, tc.hasID)
			if ok != tc.ok || stepBack != tc.stepBack || (ok && (got.Next != tc.wantNext || got.Seq != tc.wantSeq || got.State[0] != byte(tc.wantNext))) {
				t.Fatalf("ForCommitted = next %d seq %d stepBack %v ok %v; want %d %d %v %v", got.Next, got.Seq, stepBack, ok, tc.wantNext, tc.wantSeq, tc.stepBack, tc.ok)
			}
		})
	}
}

func TestCommitMetadata(t *testing.T) {
	for _, n := range []CommitNote{
		NoCommitNote,
		{Snapshot: ID{1 << 32, 1}, IdleFlushAt: -1, IdleFlushAhead: -1},
		{Snapshot: ID{1 << 32, 7}, IdleFlushAt: 0, IdleFlushAhead: -1},
		{Snapshot: ID{3 << 32, 2}, IdleFlushAt: 123456, IdleFlushAhead: -1},
		{Snapshot: ID{^uint64(0), ^uint64(0)}, IdleFlushAt: 1<<63 - 1, IdleFlushAhead: -1},
		{Snapshot: ID{3, 2}, IdleFlushAt: 10, IdleFlushAhead: 12},
		{Snapshot: ID{3, 2}, IdleFlushAt: -1, IdleFlushAhead: 0},
	} {
		got, ok, err := ParseCommitMetadata(CommitMetadata(n))
		if err != nil || !ok || got != n {
			t.Errorf("round trip of %+v (%q): %+v %v %v", n, CommitMetadata(n), got, ok, err)
		}
	}
	// Stored commits must stay readable: the format of each field is fixed.
	for _, tc := range []struct {
		n    CommitNote
		meta string
	}{
		{CommitNote{Snapshot: ID{5, 6}, IdleFlushAt: 9, IdleFlushAhead: -1}, "velocity-snapshot:5.6;idle-flush=9"},
		{CommitNote{Snapshot: ID{5, 6}, IdleFlushAt: 9, IdleFlushAhead: 11}, "velocity-snapshot:5.6;idle-flush=9;idle-flush-ahead=11"},
		{CommitNote{Snapshot: ID{5, 6}, IdleFlushAt: -1, IdleFlushAhead: 11}, "velocity-snapshot:5.6;idle-flush-ahead=11"},
	} {
		if m := CommitMetadata(tc.n); m != tc.meta {
			t.Errorf("metadata %q, want %q: the format changed", m, tc.meta)
		}
		if n, ok, err := ParseCommitMetadata(tc.meta); !ok || err != nil || n != tc.n {
			t.Errorf("ParseCommitMetadata(%q) = %+v %v %v, want %+v", tc.meta, n, ok, err, tc.n)
		}
	}
	if got := (CommitNote{IdleFlushAt: 9, IdleFlushAhead: 11}).LastIdleFlush(); got != 11 {
		t.Errorf("LastIdleFlush = %d, want the release ahead, 11", got)
	}
	if got := (CommitNote{IdleFlushAt: 9, IdleFlushAhead: -1}).LastIdleFlush(); got != 9 {
		t.Errorf("LastIdleFlush = %d, want 9", got)
	}
	for _, tc := range []struct {
		meta    string
		wantErr bool
	}{
		{"", false},
		{"someone else's note", false},
		{"velocity-snapshot:", true},
		{"velocity-snapshot:12", true},
		{"velocity-snapshot:x.1", true},
		{"velocity-snapshot:1.-2", true},
		{"velocity-snapshot:1.2;idle-flush=", true},
		{"velocity-snapshot:1.2;idle-flush=-5", true},
		{"velocity-snapshot:1.2;idle-flush=7x", true},
		{"velocity-snapshot:1.2;idle-flush-ahead=", true},
		{"velocity-snapshot:1.2;idle-flush-ahead=-1", true},
		{"velocity-snapshot:1.2;idle-flush-ahead=3;idle-flush=2", true}, // out of order
		{"velocity-snapshot:1.2;idle-flush=2;idle-flush=3", true},
		{"velocity-snapshot:1.2;idle-flush=2;", true},
		{"velocity-snapshot:1.2;other=2", true},
		{"velocity-snapshot:1.2;", true},
	} {
		n, ok, err := ParseCommitMetadata(tc.meta)
		if ok || (err != nil) != tc.wantErr || n != NoCommitNote {
			t.Errorf("ParseCommitMetadata(%q) = %+v ok %v err %v; want no note and error %v", tc.meta, n, ok, err, tc.wantErr)
		}
	}
}

func FuzzParseCommitMetadata(f *testing.F) {
	f.Add("velocity-snapshot:4294967297.3")
	f.Add("velocity-snapshot:4294967297.3;idle-flush=77")
	f.Add("velocity-snapshot:4294967297.3;idle-flush=77;idle-flush-ahead=79")
	f.Add("velocity-snapshot:4294967297.3;idle-flush-ahead=79")
	f.Add("")
	f.Add("velocity-snapshot:1.")
	f.Fuzz(func(t *testing.T, meta string) {
		n, ok, err := ParseCommitMetadata(meta)
		if ok != (err == nil && len(meta) >= len(commitMetaPrefix) && meta[:len(commitMetaPrefix)] == commitMetaPrefix) {
			t.Fatalf("%q: ok %v err %v", meta, ok, err)
		}
		if ok {
			// Leading zeros or a plus sign parse too; the note must still round-trip.
			if again, ok2, _ := ParseCommitMetadata(CommitMetadata(n)); !ok2 || again != n {
				t.Fatalf("%q parsed as %+v, which does not round-trip", meta, n)
			}
		}
	})
}

func TestCommittedBefore(t *testing.T) {
	snap := func(epoch, seq uint64) Snapshot { return Snapshot{Next: int64(10 * seq), Epoch: epoch, Seq: seq} }
	prev := func(epoch, seq uint64) *Snapshot { s := snap(epoch, seq); return &s }
	for _, c := range []struct {
		name string
		l    Loaded
		want bool
	}{
		{"one owner, two in a row", Loaded{Snapshot: snap(3, 8), Previous: prev(3, 7)}, true},
		{"one snapshot only: a first transaction may have aborted", Loaded{Snapshot: snap(3, 1)}, false},
		{"two owners: each may have lost its first transaction", Loaded{Snapshot: snap(4, 1), Previous: prev(3, 1)}, false},
		{"one owner, a gap", Loaded{Snapshot: snap(3, 9), Previous: prev(3, 7)}, false},
		{"a step back's re-save before the discarded one", Loaded{Snapshot: snap(3, 7), Previous: prev(3, 8)}, false},
		{"fell back: the newest was corrupt", Loaded{Snapshot: snap(3, 7), FellBack: true}, false},
		{"frames from before owner epochs", Loaded{Snapshot: snap(0, 1), Previous: prev(0, 0)}, false},
	} {
		if got := CommittedBefore(c.l); got != c.want {
			t.Errorf("%s: CommittedBefore = %v, want %v", c.name, got, c.want)
		}
	}
}
