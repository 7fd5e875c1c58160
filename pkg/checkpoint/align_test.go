package checkpoint

import "testing"

func TestForCommitted(t *testing.T) {
	snap := func(next int64) Snapshot { return Snapshot{Next: next, State: []byte{byte(next)}} }
	prev := func(next int64) *Snapshot { s := snap(next); return &s }
	for _, tc := range []struct {
		name      string
		loaded    Loaded
		committed int64
		wantNext  int64
		stepBack  bool
		ok        bool
	}{
		{"newest matches the committed transaction", Loaded{Snapshot: snap(20), Previous: prev(10)}, 20, 20, false, true},
		{"crash between save and commit: step back", Loaded{Snapshot: snap(30), Previous: prev(20)}, 20, 20, true, true},
		{"newest corrupt, the previous matches", Loaded{Snapshot: snap(20), FellBack: true}, 20, 20, false, true},
		{"newest ahead and no previous", Loaded{Snapshot: snap(30)}, 20, 0, false, false},
		{"both ahead of the commit", Loaded{Snapshot: snap(40), Previous: prev(30)}, 20, 0, false, false},
		{"snapshot behind the commit (store lost or mode switched)", Loaded{Snapshot: snap(10), Previous: prev(5)}, 20, 0, false, false},
		{"nothing committed yet", Loaded{Snapshot: snap(10)}, -1, 0, false, false},
		{"committed zero with a matching snapshot", Loaded{Snapshot: snap(0)}, 0, 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, stepBack, ok := ForCommitted(tc.loaded, tc.committed)
			if ok != tc.ok || stepBack != tc.stepBack || (ok && (got.Next != tc.wantNext || got.State[0] != byte(tc.wantNext))) {
				t.Fatalf("ForCommitted = next %d stepBack %v ok %v; want %d %v %v", got.Next, stepBack, ok, tc.wantNext, tc.stepBack, tc.ok)
			}
		})
	}
}
