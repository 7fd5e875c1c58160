package checkpoint

import (
	"context"
	"fmt"
	"sync"
)

// MemoryStore keeps snapshots in process memory: for tests and the demo, where
// the state needs to survive a rebalance inside one process but not a restart.
type MemoryStore struct {
	mu     sync.Mutex
	snaps  map[Key][2][]byte // newest, previous (framed)
	claims map[Key]uint64    // highest owner epoch claimed
	segs   map[segKey]memSegment
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{snaps: make(map[Key][2][]byte), claims: make(map[Key]uint64)}
}

// Claim implements Store. Claims and saves are serialised by one mutex, so a
// Save that returned before a Claim landed, and every later one with a lower
// epoch is refused.
func (s *MemoryStore) Claim(_ context.Context, key Key, tiebreak uint32) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := NextEpoch(s.claims[key], tiebreak)
	s.claims[key] = e
	return e, nil
}

// Save implements Store.
func (s *MemoryStore) Save(_ context.Context, key Key, snap Snapshot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.claims[key]; snap.writer() < c {
		return fmt.Errorf("save snapshot %s with epoch %d, claimed %d: %w", key, snap.writer(), c, ErrFenced)
	}
	s.snaps[key] = [2][]byte{Encode(snap), s.snaps[key][0]}
	return nil
}

// Load implements Store.
func (s *MemoryStore) Load(_ context.Context, key Key) (Loaded, error) {
	s.mu.Lock()
	pair, ok := s.snaps[key]
	s.mu.Unlock()
	if !ok {
		return Loaded{}, ErrNotFound
	}
	snap, err := Decode(pair[0])
	if err == nil {
		l := Loaded{Snapshot: snap}
		if pair[1] != nil {
			if prev, err := Decode(pair[1]); err == nil {
				l.Previous = &prev
			}
		}
		return l, nil
	}
	if pair[1] == nil {
		return Loaded{}, err
	}
	prev, errPrev := Decode(pair[1])
	if errPrev != nil {
		return Loaded{}, err
	}
	return Loaded{Snapshot: prev, FellBack: true, CorruptErr: err}, nil
}

// Close implements Store.
func (s *MemoryStore) Close() error { return nil }
