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
//
// Ownership. A partition moves between instances, and an instance that was
// frozen (SIGSTOP, a long GC pause, a VM migration) can wake up still believing
// it owns a partition the group gave to someone else. Every store therefore
// fences old owners: a new owner Claims the partition before it restores, and
// gets an owner epoch above every epoch claimed before; from then on a Save
// carrying a lower epoch fails with ErrFenced, and nothing it wrote is ever
// returned by Load. The invariant: once Claim has returned, no write of a
// previous owner lands.
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

// ErrFenced means a Save was refused because a newer owner has claimed the
// partition (its epoch is above the snapshot's). The saver must stop working
// on the partition: it is not its own any more.
var ErrFenced = errors.New("checkpoint: fenced: a newer owner has claimed the partition")

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
	// Epoch is the owner epoch (Store.Claim) of the instance that took it.
	Epoch uint64
	// Seq numbers an owner's snapshots (1, 2, …). With Epoch it names a
	// snapshot uniquely: exactly-once commits carry (Epoch, Seq) in the
	// offset commit's metadata, so that recovery resumes from the very
	// snapshot that was committed, even when two snapshots share a Next (a
	// checkpoint after an idle release moves no offset).
	Seq uint64
	// Writer is the owner epoch of the instance saving it, which the store
	// checks against the partition's claim; zero means Epoch. It differs from
	// Epoch only when a new owner saves again a snapshot an earlier owner
	// took (exactly-once recovery's step back keeps the committed ID). It is
	// not stored: Load returns it as zero.
	Writer uint64
}

// writer is the epoch a Save of s is fenced by.
func (s Snapshot) writer() uint64 {
	if s.Writer != 0 {
		return s.Writer
	}
	return s.Epoch
}

// ID is the snapshot's (Epoch, Seq), or the zero ID for snapshots of the
// first frame version, which had neither.
func (s Snapshot) ID() ID { return ID{Epoch: s.Epoch, Seq: s.Seq} }

// ID names a snapshot: the owner epoch that saved it and its sequence number
// within that ownership.
type ID struct{ Epoch, Seq uint64 }

// Store keeps snapshots.
type Store interface {
	// Claim records that a new owner takes key over and returns its owner
	// epoch: above every epoch claimed for key before. tiebreak (the claimant's
	// group generation) orders two claims that would otherwise be equal, made
	// by instances that read the store at the same moment. Once Claim has
	// returned, a Save with a lower epoch fails with ErrFenced and Load never
	// returns what such a Save wrote.
	Claim(ctx context.Context, key Key, tiebreak uint32) (epoch uint64, err error)
	// Save makes snap durable for key before it returns; the previous snapshot
	// is kept as a fallback. It fails with ErrFenced when the writer's epoch (snap.Writer, or snap.Epoch) is below
	// the partition's claimed epoch.
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
//	magic "VSNP" | version u16 | next i64 | epoch u64 | seq u64 | state length u64 | state | crc32c u32
//
// The CRC (Castagnoli) covers everything before it. Version 1 frames, written
// before owner epochs existed, lack epoch and seq; Decode reads them as 0.
const (
	frameVersion   = 2
	frameHeader    = 4 + 2 + 8 + 8 + 8 + 8
	frameHeaderV1  = 4 + 2 + 8 + 8
	frameTrailer   = 4
	frameVersionV1 = 1
)

// NextEpoch is the epoch a claim made after epochs up to highest returns:
// the claim counter (high 32 bits) one above highest's, and tiebreak below.
func NextEpoch(highest uint64, tiebreak uint32) uint64 {
	return (highest>>32+1)<<32 | uint64(tiebreak)
}

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
	b = binary.BigEndian.AppendUint64(b, snap.Epoch)
	b = binary.BigEndian.AppendUint64(b, snap.Seq)
	return binary.BigEndian.AppendUint64(b, uint64(len(snap.State)))
}

// Decode checks and unwraps a frame made by Encode. The returned State aliases b.
func Decode(b []byte) (Snapshot, error) {
	if len(b) < frameHeaderV1+frameTrailer {
		return Snapshot{}, fmt.Errorf("%w: %d bytes is shorter than a frame", ErrCorrupt, len(b))
	}
	if [4]byte(b[:4]) != frameMagic {
		return Snapshot{}, fmt.Errorf("%w: bad magic", ErrCorrupt)
	}
	body, sum := b[:len(b)-frameTrailer], binary.BigEndian.Uint32(b[len(b)-frameTrailer:])
	if crcOf(body) != sum {
		return Snapshot{}, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	var snap Snapshot
	header := frameHeader
	switch v := binary.BigEndian.Uint16(b[4:]); v {
	case frameVersion:
		if len(body) < frameHeader {
			return Snapshot{}, fmt.Errorf("%w: %d bytes is shorter than a frame", ErrCorrupt, len(b))
		}
		snap.Epoch = binary.BigEndian.Uint64(b[14:])
		snap.Seq = binary.BigEndian.Uint64(b[22:])
	case frameVersionV1:
		header = frameHeaderV1
	default:
		return Snapshot{}, fmt.Errorf("%w: unknown version %d (this build reads %d and %d)", ErrCorrupt, v, frameVersionV1, frameVersion)
	}
	snap.Next = int64(binary.BigEndian.Uint64(b[6:]))
	n := binary.BigEndian.Uint64(b[header-8:])
	if n != uint64(len(body)-header) {
		return Snapshot{}, fmt.Errorf("%w: state length %d does not match frame", ErrCorrupt, n)
	}
	if snap.Next < 0 {
		return Snapshot{}, fmt.Errorf("%w: negative next offset", ErrCorrupt)
	}
	snap.State = body[header:]
	return snap, nil
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
