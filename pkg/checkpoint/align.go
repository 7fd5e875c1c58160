package checkpoint

// ForCommitted picks the snapshot that exactly-once recovery may resume from,
// given the group's committed offset for the partition (negative: nothing
// committed).
//
// In exactly-once mode a checkpoint saves the snapshot and only then commits
// the transaction holding the interval's outputs and the offset. A crash
// between the two leaves a newest snapshot whose Next is ahead of the
// committed offset, and its outputs were aborted: resuming from it would
// lose them. The only safe state is the one whose Next equals the committed
// offset exactly, which is the newest or, after such a crash, the previous.
//
// stepBack reports that the previous snapshot was chosen; the caller must
// save it again before its next checkpoint, so that the discarded snapshot
// can never become "the previous one" of a later crash. ok=false means no
// stored snapshot matches: the caller rebuilds from the committed offset.
func ForCommitted(l Loaded, committed int64) (snap Snapshot, stepBack, ok bool) {
	switch {
	case committed < 0:
		return Snapshot{}, false, false
	case l.Next == committed:
		return l.Snapshot, false, true
	case l.Previous != nil && l.Previous.Next == committed:
		return *l.Previous, true, true
	}
	return Snapshot{}, false, false
}
