package checkpoint

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SegmentStore is a Store that also keeps segments: immutable blobs beside a
// partition's snapshots that a snapshot's state refers to by reference, so that
// data an earlier snapshot saved need not be written again (pkg/watermark keeps
// its dedupe ids this way). A segment is framed and checksummed like a snapshot.
//
// References are unique per write (a random nonce), so two processes writing
// the same partition (a zombie and the new owner) never overwrite each other's
// segments. Deleting a segment is the writer's decision: the store never drops
// one by itself.
type SegmentStore interface {
	Store
	// PutSegment makes data durable as a new segment of key before it
	// returns, and returns the reference that names it.
	PutSegment(ctx context.Context, key Key, data []byte) (ref []byte, err error)
	// GetSegment returns a segment's data, verified: ErrNotFound when it is
	// missing, ErrCorrupt when it fails its checks.
	GetSegment(ctx context.Context, key Key, ref []byte) ([]byte, error)
	// DeleteSegment removes a segment; removing a missing one is not an error.
	// (KafkaStore writes tombstones: the chunks go at the topic's compaction.)
	DeleteSegment(ctx context.Context, key Key, ref []byte) error
}

// SegmentLister is a SegmentStore that can list a partition's segments, so that
// an owner can delete the ones no snapshot lists: left by a crash between
// writing a segment and saving the snapshot that lists it, or by an owner that
// released the partition. All three stores list.
type SegmentLister interface {
	SegmentStore
	ListSegments(ctx context.Context, key Key) ([]SegmentInfo, error)
}

// SegmentInfo describes one stored segment.
type SegmentInfo struct {
	Ref     []byte
	Written time.Time
}

var (
	_ SegmentLister = (*FileStore)(nil)
	_ SegmentLister = (*MemoryStore)(nil)
	_ SegmentLister = (*KafkaStore)(nil)
)

// FileStore segments are DIR/<group>/<topic>/<partition>.seg-<nonce>, where the
// reference is the 16 hex digits of the nonce.

func (s *FileStore) segmentPath(key Key, ref []byte) (string, error) {
	if len(ref) != 16 {
		return "", fmt.Errorf("%w: segment reference %q is not 16 hex digits", ErrCorrupt, ref)
	}
	if _, err := hex.DecodeString(string(ref)); err != nil {
		return "", fmt.Errorf("%w: segment reference %q is not 16 hex digits", ErrCorrupt, ref)
	}
	dir, _, _ := s.paths(key)
	return filepath.Join(dir, strconv.Itoa(int(key.Partition))+".seg-"+string(ref)), nil
}

// PutSegment implements SegmentStore. A crash mid-write leaves a file no
// snapshot names (its reference was never returned).
func (s *FileStore) PutSegment(_ context.Context, key Key, data []byte) ([]byte, error) {
	dir, _, _ := s.paths(key)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("save segment %s: %w", key, err)
	}
	ref := fmt.Appendf(nil, "%016x", randomNonce())
	path, _ := s.segmentPath(key, ref)
	h, st, tr := frameParts(Snapshot{State: data})
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("save segment %s: %w", key, err)
	}
	for _, part := range [][]byte{h, st, tr} {
		if _, err = f.Write(part); err != nil {
			break
		}
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("save segment %s: %w", key, err)
	}
	return ref, nil
}

// GetSegment implements SegmentStore.
func (s *FileStore) GetSegment(_ context.Context, key Key, ref []byte) ([]byte, error) {
	path, err := s.segmentPath(key, ref)
	if err != nil {
		return nil, err
	}
	snap, err := readFrame(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("segment %s of %s: %w", ref, key, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("segment %s of %s: %w", ref, key, err)
	}
	return snap.State, nil
}

// DeleteSegment implements SegmentStore.
func (s *FileStore) DeleteSegment(_ context.Context, key Key, ref []byte) error {
	path, err := s.segmentPath(key, ref)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("delete segment %s of %s: %w", ref, key, err)
	}
	return nil
}

// ListSegments implements SegmentLister.
func (s *FileStore) ListSegments(_ context.Context, key Key) ([]SegmentInfo, error) {
	dir, _, _ := s.paths(key)
	prefix := strconv.Itoa(int(key.Partition)) + ".seg-"
	names, err := filepath.Glob(filepath.Join(dir, prefix+"*"))
	if err != nil {
		return nil, err
	}
	var out []SegmentInfo
	for _, name := range names {
		ref := []byte(strings.TrimPrefix(filepath.Base(name), prefix))
		if _, err := s.segmentPath(key, ref); err != nil {
			continue // not a name PutSegment makes
		}
		fi, err := os.Stat(name)
		if err != nil {
			continue // deleted meanwhile
		}
		out = append(out, SegmentInfo{Ref: ref, Written: fi.ModTime()})
	}
	return out, nil
}

// PutSegment implements SegmentStore.
func (s *MemoryStore) PutSegment(_ context.Context, key Key, data []byte) ([]byte, error) {
	ref := fmt.Appendf(nil, "%016x", randomNonce())
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.segs == nil {
		s.segs = map[segKey]memSegment{}
	}
	s.segs[segKey{key, string(ref)}] = memSegment{frame: Encode(Snapshot{State: data}), written: time.Now()}
	return ref, nil
}

// ListSegments implements SegmentLister.
func (s *MemoryStore) ListSegments(_ context.Context, key Key) ([]SegmentInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []SegmentInfo
	for k, seg := range s.segs {
		if k.key == key {
			out = append(out, SegmentInfo{Ref: []byte(k.ref), Written: seg.written})
		}
	}
	return out, nil
}

// GetSegment implements SegmentStore.
func (s *MemoryStore) GetSegment(_ context.Context, key Key, ref []byte) ([]byte, error) {
	s.mu.Lock()
	seg, ok := s.segs[segKey{key, string(ref)}]
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("segment %s of %s: %w", ref, key, ErrNotFound)
	}
	snap, err := Decode(seg.frame)
	if err != nil {
		return nil, fmt.Errorf("segment %s of %s: %w", ref, key, err)
	}
	return snap.State, nil
}

// DeleteSegment implements SegmentStore.
func (s *MemoryStore) DeleteSegment(_ context.Context, key Key, ref []byte) error {
	s.mu.Lock()
	delete(s.segs, segKey{key, string(ref)})
	s.mu.Unlock()
	return nil
}

type segKey struct {
	key Key
	ref string
}

type memSegment struct {
	frame   []byte
	written time.Time
}

// KafkaStore segments are chunked like snapshots, in the key's chunk
// partition, as generation 0 (snapshots start at 1) with a fresh nonce; the
// reference is the encoded entry, which holds the offset to read from.
//
// So that they can be listed without reading the chunk partition (every
// snapshot's chunks), each segment also has an index record in the manifest
// partition, keyed by its nonce and holding its reference and when it was
// written; deleting the segment tombstones it too, so compaction keeps one
// small record per live segment there. The index record is written after the
// chunks: a crash between the two leaves chunks nothing lists, as any crash
// did before the index.

// segIndexKey names a segment's index record: "s/<group>/<topic>/<partition>/<nonce>".
func segIndexKey(k Key, nonce uint64) []byte {
	return fmt.Appendf(segIndexPrefix(k), "%016x", nonce)
}

func segIndexPrefix(k Key) []byte {
	return fmt.Appendf(nil, "s/%s/%s/%d/", url.PathEscape(k.Group), url.PathEscape(k.Topic), k.Partition)
}

// Segment index value layout, big-endian: magic "VSEG" | entry | written unix ms i64 | crc32c u32.
var segIndexMagic = [4]byte{'V', 'S', 'E', 'G'}

const segIndexLen = 4 + entryLen + 8 + 4

func encodeSegIndex(e entry, written time.Time) []byte {
	b := make([]byte, 0, segIndexLen)
	b = append(b, segIndexMagic[:]...)
	b = appendEntry(b, e)
	b = binary.BigEndian.AppendUint64(b, uint64(written.UnixMilli()))
	return binary.BigEndian.AppendUint32(b, crcOf(b))
}

func decodeSegIndex(b []byte) (ref []byte, written time.Time, ok bool) {
	if len(b) != segIndexLen || [4]byte(b[:4]) != segIndexMagic || crcOf(b[:len(b)-4]) != binary.BigEndian.Uint32(b[len(b)-4:]) {
		return nil, time.Time{}, false
	}
	return bytes.Clone(b[4 : 4+entryLen]), time.UnixMilli(int64(binary.BigEndian.Uint64(b[4+entryLen:]))), true
}

// PutSegment implements SegmentStore.
func (s *KafkaStore) PutSegment(ctx context.Context, key Key, data []byte) ([]byte, error) {
	e, err := s.produceChunks(ctx, key, Snapshot{State: data}, 0)
	if err != nil {
		return nil, fmt.Errorf("save segment %s: %w", key, err)
	}
	idx := &kgo.Record{Topic: s.topic, Partition: manifestPartition, Key: segIndexKey(key, e.Nonce), Value: encodeSegIndex(e, time.Now())}
	if err := s.produceSync(ctx, idx).FirstErr(); err != nil {
		return nil, fmt.Errorf("save segment %s: produce its index record to %s: %w", key, s.topic, err)
	}
	return appendEntry(nil, e), nil
}

// ListSegments implements SegmentLister: the index records of key's segments
// in the manifest partition, up to its end when the call begins. A damaged
// index record is skipped (its segment stays, as garbage).
func (s *KafkaStore) ListSegments(ctx context.Context, key Key) ([]SegmentInfo, error) {
	prefix := segIndexPrefix(key)
	live := map[string]SegmentInfo{}
	err := s.scan(ctx, manifestPartition, -1, func(r *kgo.Record) bool {
		if !bytes.HasPrefix(r.Key, prefix) {
			return true
		}
		if r.Value == nil {
			delete(live, string(r.Key))
			return true
		}
		if ref, written, ok := decodeSegIndex(r.Value); ok {
			live[string(r.Key)] = SegmentInfo{Ref: ref, Written: written}
		}
		return true
	})
	if err != nil {
		return nil, fmt.Errorf("list segments of %s: %w", key, err)
	}
	out := make([]SegmentInfo, 0, len(live))
	for _, k := range slices.Sorted(maps.Keys(live)) {
		out = append(out, live[k])
	}
	return out, nil
}

func (s *KafkaStore) segmentEntry(ref []byte) (entry, error) {
	if len(ref) != entryLen {
		return entry{}, fmt.Errorf("%w: segment reference of %d bytes, want %d", ErrCorrupt, len(ref), entryLen)
	}
	e := readEntry(ref)
	if e.Gen != 0 || e.Chunks == 0 || e.First < 0 || e.Partition < 0 || e.Partition >= max(s.partitions, 1) {
		return entry{}, fmt.Errorf("%w: segment reference out of range", ErrCorrupt)
	}
	return e, nil
}

// GetSegment implements SegmentStore.
func (s *KafkaStore) GetSegment(ctx context.Context, key Key, ref []byte) ([]byte, error) {
	e, err := s.segmentEntry(ref)
	if err != nil {
		return nil, err
	}
	snaps, errs := s.readEntries(ctx, key, []entry{e})
	if errs[0] != nil {
		return nil, fmt.Errorf("segment of %s: %w", key, errs[0])
	}
	return snaps[0].State, nil
}

// DeleteSegment implements SegmentStore: tombstones for its chunks, then for
// its index record.
func (s *KafkaStore) DeleteSegment(ctx context.Context, key Key, ref []byte) error {
	e, err := s.segmentEntry(ref)
	if err != nil {
		return err
	}
	if err := s.tombstone(ctx, key, e); err != nil {
		return err
	}
	return s.produceSync(ctx, &kgo.Record{Topic: s.topic, Partition: manifestPartition, Key: segIndexKey(key, e.Nonce)}).FirstErr()
}
