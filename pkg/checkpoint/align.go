package checkpoint

import (
	"fmt"
	"strconv"
	"strings"
)

// ForCommitted picks the snapshot that exactly-once recovery may resume from,
// given the group's committed offset for the partition (negative: nothing
// committed) and the ID its commit carried (ok=false when the commit carried
// none: one made before commits named their snapshot).
//
// In exactly-once mode a checkpoint saves the snapshot and only then commits
// the transaction holding the interval's outputs and the offset. A crash
// between the two leaves a newest snapshot that the committed transaction does
// not cover, and its outputs were aborted: resuming from it would lose them.
// The only safe state is the one the committed transaction names, which is the
// newest or, after such a crash, the previous. Its Next alone does not name
// it: a checkpoint after an idle release publishes outputs without moving the
// offset, so two snapshots can share a Next; the ID tells them apart.
//
// stepBack reports that the previous snapshot was chosen; the caller must
// save it again before its next checkpoint, so that the discarded snapshot
// can never become "the previous one" of a later crash. ok=false means no
// stored snapshot matches: the caller rebuilds from the committed offset.
func ForCommitted(l Loaded, committed int64, id ID, hasID bool) (snap Snapshot, stepBack, ok bool) {
	matches := func(s Snapshot) bool { return s.Next == committed && (!hasID || s.ID() == id) }
	switch {
	case committed < 0:
		return Snapshot{}, false, false
	case matches(l.Snapshot):
		return l.Snapshot, false, true
	case l.Previous != nil && matches(*l.Previous):
		return *l.Previous, true, true
	}
	return Snapshot{}, false, false
}

// commitMetaPrefix starts the offset commit metadata that names a snapshot.
const commitMetaPrefix = "velocity-snapshot:"

// CommitMetadata is the offset commit metadata that names the snapshot id:
// "velocity-snapshot:<epoch>.<seq>".
func CommitMetadata(id ID) string {
	return commitMetaPrefix + strconv.FormatUint(id.Epoch, 10) + "." + strconv.FormatUint(id.Seq, 10)
}

// ParseCommitMetadata reads what CommitMetadata wrote. Metadata that is empty
// or not ours gives ok=false and no error (a commit made by an older version,
// or by another tool); metadata that starts like ours and does not parse is an
// error.
func ParseCommitMetadata(meta string) (id ID, ok bool, err error) {
	rest, found := strings.CutPrefix(meta, commitMetaPrefix)
	if !found {
		return ID{}, false, nil
	}
	e, s, found := strings.Cut(rest, ".")
	if found {
		id.Epoch, err = strconv.ParseUint(e, 10, 64)
		if err == nil {
			id.Seq, err = strconv.ParseUint(s, 10, 64)
		}
	}
	if !found || err != nil {
		return ID{}, false, fmt.Errorf("offset commit metadata %q does not name a snapshot", meta)
	}
	return id, true, nil
}
