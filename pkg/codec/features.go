package codec

import (
	"errors"
	"fmt"
	"math"
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
func AppendFeatures(dst []byte, f *Features) []byte {
	dst = AppendString(dst, f.EventID)
	dst = AppendString(dst, f.EntityID)
	dst = AppendLong(dst, f.EventTime)
	if n := len(f.Windows); n > 0 {
		dst = AppendLong(dst, int64(n))
		for i := range f.Windows {
			w := &f.Windows[i]
			dst = AppendString(dst, w.Name)
			dst = AppendLong(dst, w.WindowMs)
			dst = AppendLong(dst, w.BucketMs)
			dst = AppendLong(dst, w.Count)
			dst = AppendLong(dst, w.SumMinor)
			dst = AppendLong(dst, w.MinMinor)
			dst = AppendLong(dst, w.MaxMinor)
		}
	}
	dst = append(dst, 0) // end of the array
	if f.HasPrevious {
		dst = append(dst, 2) // union branch 1: long
		dst = AppendLong(dst, f.MsSincePrevious)
	} else {
		dst = append(dst, 0) // union branch 0: null
	}
	if f.Late {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	dst = AppendString(dst, f.SourceTopic)
	// An Avro int is the same zig-zag varint as a long with a 32-bit range.
	dst = AppendLong(dst, int64(f.SourcePartition))
	return AppendLong(dst, f.SourceOffset)
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
