// Package checkpoint stores partition snapshots durably so that Kafka offsets can
// be committed only after the state that goes with them is safe.
//
// The protocol it serves (see pkg/service): flush the sink for every output of
// offsets before next → Save the snapshot → only then commit next. A snapshot is
// an opaque payload (pkg/pipeline's encoding) wrapped in a versioned, checksummed
// frame, so a torn or altered file is detected and reported, never half-loaded.
//
// Three stores implement Store: FileStore (one directory, fsync + rename),
// KafkaStore (a compacted topic, chunked, so a partition can move between
// instances) and MemoryStore (tests and the demo).
//
// It is not a general key-value store: one snapshot per (group, topic, partition),
// the newest and the one before it. Both are kept because recovery needs the
// older one in two cases: the newest is corrupt, or (exactly-once mode) the
// newest was saved for a transaction that never committed.
package checkpoint

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// ErrNotFound means no snapshot exists for the partition.
var ErrNotFound = errors.New("checkpoint: no snapshot")

// ErrCorrupt means a stored snapshot failed its checksum or framing checks.
var ErrCorrupt = errors.New("checkpoint: corrupt snapshot")

// Key names one partition's snapshot.
type Key struct {
	Group     string
	Topic     string
	Partition int32
}

func (k Key) String() string { return fmt.Sprintf("%s/%s/%d", k.Group, k.Topic, k.Partition) }

// Snapshot is one partition's saved state.
type Snapshot struct {
	// Next is the first input offset not covered by the state: consumption
	// resumes there and the group commit that follows the save is Next.
	Next int64
	// State is the processor's encoded state (pkg/pipeline).
	State []byte
}

// Store keeps snapshots.
type Store interface {
	// Save makes snap durable for key before it returns; the previous snapshot
	// is kept as a fallback.
	Save(ctx context.Context, key Key, snap Snapshot) error
	// Load returns the newest valid snapshot. If the newest is corrupt it falls
	// back to the previous one and reports the fallback through Loaded.FellBack.
	// With no snapshot at all it returns ErrNotFound.
	Load(ctx context.Context, key Key) (Loaded, error)
	// Close releases the store's resources.
	Close() error
}

// Loaded is the result of a Load.
type Loaded struct {
	Snapshot
	// FellBack is set when the newest snapshot was corrupt and the previous one
	// was used; CorruptErr says what was wrong with the newest.
	FellBack   bool
	CorruptErr error
	// Previous is the snapshot saved before Snapshot, when it exists and is
	// valid (nil after a fall-back: Snapshot already is the previous one).
	// Exactly-once recovery uses it when Snapshot is ahead of the committed
	// transaction.
	Previous *Snapshot
}

// Frame layout, big-endian:
//
//	magic "VSNP" | version u16 | next i64 | state length u64 | state | crc32c u32
//
// The CRC (Castagnoli) covers everything before it.
const (
	frameVersion = 1
	frameHeader  = 4 + 2 + 8 + 8
	frameTrailer = 4
)

var (
	frameMagic = [4]byte{'V', 'S', 'N', 'P'}
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

// Encode frames a snapshot.
func Encode(snap Snapshot) []byte {
	b := make([]byte, 0, frameHeader+len(snap.State)+frameTrailer)
	b = appendHeader(b, snap)
	b = append(b, snap.State...)
	return binary.BigEndian.AppendUint32(b, crcOf(b))
}

// frameParts returns Encode's output as three pieces (header, the state
// itself, trailer), so that a writer can send a large state without copying it.
func frameParts(snap Snapshot) (header, state, trailer []byte) {
	header = appendHeader(make([]byte, 0, frameHeader), snap)
	sum := crc32.Update(crcOf(header), castagnoli, snap.State)
	return header, snap.State, binary.BigEndian.AppendUint32(nil, sum)
}

func appendHeader(b []byte, snap Snapshot) []byte {
	b = append(b, frameMagic[:]...)
	b = binary.BigEndian.AppendUint16(b, frameVersion)
	b = binary.BigEndian.AppendUint64(b, uint64(snap.Next))
	return binary.BigEndian.AppendUint64(b, uint64(len(snap.State)))
}

// Decode checks and unwraps a frame made by Encode. The returned State aliases b.
func Decode(b []byte) (Snapshot, error) {
	if len(b) < frameHeader+frameTrailer {
		return Snapshot{}, fmt.Errorf("%w: %d bytes is shorter than a frame", ErrCorrupt, len(b))
	}
	if [4]byte(b[:4]) != frameMagic {
		return Snapshot{}, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	body, sum := b[:len(b)-frameTrailer], binary.BigEndian.Uint32(b[len(b)-frameTrailer:])
	if crcOf(body) != sum {
		return Snapshot{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	if v := binary.BigEndian.Uint16(b[4:]); v != frameVersion {
		return Snapshot{}, fmt.Errorf("%w: unknown version %d (this build reads %d)", ErrCorrupt, v, frameVersion)
	}
	next := int64(binary.BigEndian.Uint64(b[6:]))
	n := binary.BigEndian.Uint64(b[14:])
	if n != uint64(len(body)-frameHeader) {
		return Snapshot{}, fmt.Errorf("%w: state length %d does not match frame", ErrCorrupt, n)
	}
	if next < 0 {
		return Snapshot{}, fmt.Errorf("%w: negative next offset", ErrCorrupt)
	}
	return Snapshot{Next: next, State: body[frameHeader:]}, nil
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
