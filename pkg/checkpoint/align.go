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

// CommittedBefore reports whether the stored snapshots prove that the group
// once committed an offset for the partition: exactly-once recovery's question
// when the group has none now. The newest snapshot and the previous one were
// saved by one owner in a row (the same epoch, consecutive sequence numbers),
// and an owner saves its next snapshot only after the transaction of the one
// before committed, with its offset. The group has lost that offset since (the
// brokers expire an empty group's offsets, or an operator deleted them), and the
// newest snapshot is the one to resume: its own transaction committed unless
// its owner died between saving it and committing, and then no owner took the
// partition over before the offsets were lost.
//
// Anything else (one snapshot, a fall-back, two owners' snapshots) proves
// nothing: a first checkpoint whose transaction aborted also leaves a snapshot
// and no offset, and so do two of them by owners that each lost their first
// transaction. Those must not be resumed.
func CommittedBefore(l Loaded) bool {
	prev := l.Previous
	return !l.FellBack && prev != nil && prev.Epoch == l.Epoch && prev.Epoch != 0 && l.Seq == prev.Seq+1
}

// CommitNote is what an offset commit records, in its metadata, beside the
// offset: which snapshot it covers, and where the partition released its whole
// reorder buffer on its idle timeout.
type CommitNote struct {
	// Snapshot is the ID of the snapshot whose Next is the committed offset
	// (exactly-once; the default mode matches snapshots by offset alone).
	Snapshot ID
	// IdleFlushAt is the partition's Next when it last released everything
	// pending because its input was idle, at or before the committed offset
	// (-1: not known to have). A warm-up read cannot see a release the wall
	// clock decided; with this it repeats the last one at the same position,
	// so that events the previous owner released and committed are not held
	// and released (and committed) again.
	IdleFlushAt int64
	// IdleFlushAhead is a release past the committed offset (-1: none): the
	// default mode publishes a release's outputs at once, before any
	// checkpoint covers it, so it commits this note first; the next owner,
	// resuming from an earlier position, releases at the same one, and its
	// outputs are those already published (docs/checkpoints.md, "The idle
	// release is committed before its outputs").
	IdleFlushAhead int64
}

// NoCommitNote is the note of a commit that records nothing.
var NoCommitNote = CommitNote{IdleFlushAt: -1, IdleFlushAhead: -1}

// LastIdleFlush is the last release the note records, ahead of the committed
// offset or not (-1: none).
func (n CommitNote) LastIdleFlush() int64 { return max(n.IdleFlushAt, n.IdleFlushAhead) }

// commitMetaPrefix starts the offset commit metadata of a CommitNote.
const commitMetaPrefix = "velocity-snapshot:"

// The note's optional fields, after its snapshot ID.
const (
	idleFlushField      = "idle-flush="
	idleFlushAheadField = "idle-flush-ahead="
)

// CommitMetadata encodes a note as offset commit metadata:
// "velocity-snapshot:<epoch>.<seq>", then ";idle-flush=<offset>" and
// ";idle-flush-ahead=<offset>" when known.
func CommitMetadata(n CommitNote) string {
	s := commitMetaPrefix + strconv.FormatUint(n.Snapshot.Epoch, 10) + "." + strconv.FormatUint(n.Snapshot.Seq, 10)
	if n.IdleFlushAt >= 0 {
		s += ";" + idleFlushField + strconv.FormatInt(n.IdleFlushAt, 10)
	}
	if n.IdleFlushAhead >= 0 {
		s += ";" + idleFlushAheadField + strconv.FormatInt(n.IdleFlushAhead, 10)
	}
	return s
}

// ParseCommitMetadata reads what CommitMetadata wrote. Metadata that is empty
// or not ours gives ok=false and no error (a commit made by an older version,
// or by another tool); metadata that starts like ours and does not parse is an
// error. A field the metadata lacks is -1 in the note.
func ParseCommitMetadata(meta string) (n CommitNote, ok bool, err error) {
	rest, found := strings.CutPrefix(meta, commitMetaPrefix)
	if !found {
		return NoCommitNote, false, nil
	}
	bad := func() (CommitNote, bool, error) {
		return NoCommitNote, false, fmt.Errorf("offset commit metadata %q does not name a snapshot", meta)
	}
	id, fields, hasFields := strings.Cut(rest, ";")
	e, sq, found := strings.Cut(id, ".")
	if !found {
		return bad()
	}
	n = NoCommitNote
	if n.Snapshot.Epoch, err = strconv.ParseUint(e, 10, 64); err != nil {
		return bad()
	}
	if n.Snapshot.Seq, err = strconv.ParseUint(sq, 10, 64); err != nil {
		return bad()
	}
	if !hasFields {
		return n, true, nil
	}
	// Each field at most once, in CommitMetadata's order.
	parts := strings.Split(fields, ";")
	for _, f := range []struct {
		name string
		to   *int64
	}{{idleFlushField, &n.IdleFlushAt}, {idleFlushAheadField, &n.IdleFlushAhead}} {
		if len(parts) == 0 {
			break
		}
		v, found := strings.CutPrefix(parts[0], f.name)
		if !found {
			continue
		}
		parts = parts[1:]
		if *f.to, err = strconv.ParseInt(v, 10, 64); err != nil || *f.to < 0 {
			return bad()
		}
	}
	if len(parts) > 0 {
		return bad()
	}
	return n, true, nil
}
