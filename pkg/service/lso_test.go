package service

import (
	"context"
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
)

// TestLSOActivity: what an idle check counts as activity of the input topic,
// which keeps the first stages renewing their idle leases (worker.renewalsWanted).
// Each step is one request, after the ones above it; a doubt counts as activity.
func TestLSOActivity(t *testing.T) {
	const topic = "in"
	ends := func(offs ...int64) kadm.ListedOffsets {
		l := kadm.ListedOffsets{topic: {}}
		for p, o := range offs {
			l[topic][int32(p)] = kadm.ListedOffset{Topic: topic, Partition: int32(p), Offset: o}
		}
		return l
	}
	committed := func(offs ...int64) kadm.OffsetResponses {
		r := kadm.OffsetResponses{topic: {}}
		for p, o := range offs {
			r[topic][int32(p)] = kadm.OffsetResponse{Offset: kadm.Offset{Topic: topic, Partition: int32(p), At: o}}
		}
		return r
	}
	failed := errors.New("broker gone")
	steps := []struct {
		name      string
		ends      kadm.ListedOffsets
		listErr   error
		committed kadm.OffsetResponses
		commitErr error
		active    bool
	}{
		{"the first request: nothing to compare with", ends(10, 0), nil, committed(10, -1), nil, true},
		{"ends unchanged, committed to them; an empty partition needs no commit", ends(10, 0), nil, committed(10, -1), nil, false},
		{"an end moved", ends(11, 0), nil, committed(10, -1), nil, true},
		{"ends unchanged, a partition committed below its end", ends(11, 0), nil, committed(10, -1), nil, true},
		{"committed to the end again", ends(11, 0), nil, committed(11, -1), nil, false},
		{"a partition with records and no commit", ends(11, 3), nil, committed(11, -1), nil, true},
		{"still none", ends(11, 3), nil, committed(11, -1), nil, true},
		{"committed", ends(11, 3), nil, committed(11, 3), nil, false},
		{"the list failed", nil, failed, committed(11, 3), nil, true},
		{"the commits could not be fetched", ends(11, 3), nil, nil, failed, true},
		{"a partition's offset errored", kadm.ListedOffsets{topic: {0: {Topic: topic, Partition: 0, Offset: 11}, 1: {Topic: topic, Partition: 1, Err: failed}}}, nil, committed(11, 3), nil, true},
		{"a partition missing from the list", ends(11), nil, committed(11, 3), nil, true},
		{"back, at the end it had before it went missing", ends(11, 3), nil, committed(11, 3), nil, false},
		{"missing, then back with records", ends(11), nil, committed(11, 3), nil, true},
		{"back with records", ends(11, 4), nil, committed(11, 4), nil, true},
		{"quiet again", ends(11, 4), nil, committed(11, 4), nil, false},
		{"a commit missing from the answer", ends(11, 4), nil, committed(11), nil, true},
	}
	l := &lsoLookup{topic: topic}
	for i, s := range steps {
		l.committed = func(context.Context) (kadm.OffsetResponses, error) { return s.committed, s.commitErr }
		if got := l.activity(context.Background(), s.ends, s.listErr); got != s.active {
			t.Fatalf("step %d (%s): activity %v, want %v", i, s.name, got, s.active)
		}
	}
}
