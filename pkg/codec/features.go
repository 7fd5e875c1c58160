package codec

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// WindowAgg is one window's aggregates in a features record (WindowAggregate).
type WindowAgg struct {
	Name     string
	WindowMs int64
	BucketMs int64
	Count    int64
	SumMinor int64
	MinMinor int64
	MaxMinor int64
}

// Features is one output record (schemas.VelocityFeatures). MsSincePrevious is
// meaningful only when HasPrevious; otherwise the record carries null.
type Features struct {
	EventID         string
	EntityID        string
	EventTime       int64
	Windows         []WindowAgg
	MsSincePrevious int64
	HasPrevious     bool
	Late            bool
	SourceTopic     string
	SourcePartition int32
	SourceOffset    int64
}

// AppendFeatures appends f in Avro binary (VelocityFeatures schema) to dst.
// The same f always gives the same bytes: field order is the schema's, the
// windows are one block, and there is nothing map-ordered in between. It does
// not allocate when dst has enough capacity.
//
// It makes room for the longest record f can give once, then writes every
// field by index (putLong, putString) and cuts dst to what was written: about
// 25 varints per record, each appended byte by byte with a capacity check per
// byte, were most of the encoder's time.
func AppendFeatures(dst []byte, f *Features) []byte {
	n := len(dst)
	dst = slices.Grow(dst, maxFeaturesLen(f))
	b := dst[n:cap(dst)]
	i := putString(b, 0, f.EventID)
	i = putString(b, i, f.EntityID)
	i = putLong(b, i, f.EventTime)
	if len(f.Windows) > 0 {
		i = putLong(b, i, int64(len(f.Windows)))
		for k := range f.Windows {
			w := &f.Windows[k]
			i = putString(b, i, w.Name)
			i = putLong(b, i, w.WindowMs)
			i = putLong(b, i, w.BucketMs)
			i = putLong(b, i, w.Count)
			i = putLong(b, i, w.SumMinor)
			i = putLong(b, i, w.MinMinor)
			i = putLong(b, i, w.MaxMinor)
		}
	}
	b[i] = 0 // end of the array
	i++
	if f.HasPrevious {
		b[i] = 2 // union branch 1: long
		i = putLong(b, i+1, f.MsSincePrevious)
	} else {
		b[i] = 0 // union branch 0: null
		i++
	}
	b[i] = 0
	if f.Late {
		b[i] = 1
	}
	i = putString(b, i+1, f.SourceTopic)
	// An Avro int is the same zig-zag varint as a long with a 32-bit range.
	i = putLong(b, i, int64(f.SourcePartition))
	i = putLong(b, i, f.SourceOffset)
	return dst[:n+i]
}

// maxLongLen is the most bytes an Avro long takes (64 bits in 7-bit groups).
const maxLongLen = 10

// maxFeaturesLen bounds the bytes AppendFeatures writes for f: every long at
// its longest, every string's bytes and length, the array's end, the union
// branch and the boolean.
func maxFeaturesLen(f *Features) int {
	n := 3*maxLongLen + len(f.EventID) + len(f.EntityID) + len(f.SourceTopic) + // three strings' lengths
		maxLongLen + // event_time
		maxLongLen + 1 + // the windows block count, the array's end
		1 + maxLongLen + 1 + // ms_since_previous (branch, value), late
		2*maxLongLen // source_partition, source_offset
	for k := range f.Windows {
		n += maxLongLen + len(f.Windows[k].Name) + 6*maxLongLen
	}
	return n
}

// putLong writes v as an Avro long (zig-zag varint) at b[i:] and returns the
// index after it; b must have room (maxLongLen bytes).
func putLong(b []byte, i int, v int64) int {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		b[i] = byte(u) | 0x80
		u >>= 7
		i++
	}
	b[i] = byte(u)
	return i + 1
}

// putString writes s as Avro bytes (length, then the bytes) at b[i:].
func putString(b []byte, i int, s string) int {
	i = putLong(b, i, int64(len(s)))
	return i + copy(b[i:], s)
}

// ErrBadFeatures wraps every DecodeFeatures failure, so callers can tell a
// corrupt record from other errors with errors.Is.
var ErrBadFeatures = errors.New("decode velocity features")

// DecodeFeatures decodes one VelocityFeatures value written with our schema,
// for tests, replay tooling and the crash comparison. It accepts array blocks
// in any split (including negative counts with a byte size), as other Avro
// writers may produce them, and rejects trailing bytes.
func DecodeFeatures(b []byte) (Features, error) {
	var f Features
	d := featReader{b: b}
	f.EventID = string(d.bytes("event_id"))
	f.EntityID = string(d.bytes("entity_id"))
	f.EventTime = d.long("event_time")
	for d.err == nil {
		n := d.long("windows block count")
		if n == 0 || d.err != nil {
			break
		}
		if n < 0 {
			if n == math.MinInt64 {
				d.fail("windows block count", errVarintOverflow)
				break
			}
			n = -n
			d.long("windows block size")
		}
		// Every item takes at least 7 bytes; a count the rest of the record
		// cannot hold is corrupt, and must not size an allocation.
		if n > int64(len(b)-d.i)/7 {
			d.fail("windows block count", errLengthBeyondRecord)
			break
		}
		for ; n > 0 && d.err == nil; n-- {
			f.Windows = append(f.Windows, WindowAgg{
				Name:     string(d.bytes("window")),
				WindowMs: d.long("window_ms"),
				BucketMs: d.long("bucket_ms"),
				Count:    d.long("count"),
				SumMinor: d.long("sum_minor"),
				MinMinor: d.long("min_minor"),
				MaxMinor: d.long("max_minor"),
			})
		}
	}
	switch u := d.long("ms_since_previous"); {
	case d.err != nil:
	case u == 0:
	case u == 1:
		f.HasPrevious = true
		f.MsSincePrevious = d.long("ms_since_previous")
	default:
		d.fail("ms_since_previous", errBadUnionIndex)
	}
	if d.err == nil {
		if d.i >= len(b) {
			d.fail("late", errTruncated)
		} else if c := b[d.i]; c > 1 {
			d.fail("late", errBadBoolean)
		} else {
			f.Late = c == 1
			d.i++
		}
	}
	f.SourceTopic = string(d.bytes("source_topic"))
	p := d.long("source_partition")
	if d.err == nil && (p < math.MinInt32 || p > math.MaxInt32) {
		d.fail("source_partition", errIntOverflow)
	}
	f.SourcePartition = int32(p)
	f.SourceOffset = d.long("source_offset")
	if d.err == nil && d.i != len(b) {
		d.err = errors.New(strconv.Itoa(len(b)-d.i) + " trailing bytes after the record")
	}
	if d.err != nil {
		return Features{}, fmt.Errorf("%w: %w", ErrBadFeatures, d.err)
	}
	return f, nil
}

// featReader keeps the first error and turns later reads into no-ops, so the
// decode above reads like the schema.
type featReader struct {
	b   []byte
	i   int
	err error
}

func (d *featReader) fail(field string, e decodeErr) {
	if d.err == nil {
		d.err = e.rejection(field, d.i)
	}
}

func (d *featReader) long(field string) int64 {
	if d.err != nil {
		return 0
	}
	v, i, e := readLong(d.b, d.i)
	if e != errNone {
		d.fail(field, e)
		return 0
	}
	d.i = i
	return v
}

func (d *featReader) bytes(field string) []byte {
	if d.err != nil {
		return nil
	}
	v, i, e := readBytes(d.b, d.i)
	if e != errNone {
		d.fail(field, e)
		return nil
	}
	d.i = i
	return v
}
