package replay

import (
	"errors"
	"fmt"
)

// featureView is a VelocityFeatures value parsed in place: its byte fields
// point into the value. File sinks need every field of the record, and the
// Output carries only some of them decoded; parsing the bytes we are about to
// write also guarantees the file says exactly what the topic would.
// codec.DecodeFeatures does the same with an allocation per string, which
// costs a third of the replay's time at a million records; this reuses one
// view per sink and is tested against it.
type featureView struct {
	eventID, entityID []byte
	eventTime         int64
	windows           []windowView
	msSincePrevious   int64
	hasPrevious       bool
	late              bool
	sourceTopic       []byte
	sourcePartition   int32
	sourceOffset      int64
}

type windowView struct {
	name                                                    []byte
	windowMs, bucketMs, count, sumMinor, minMinor, maxMinor int64
}

var errBadValue = errors.New("features value does not parse")

// parse fills v from b, our own encoder's output (one windows block).
func (v *featureView) parse(b []byte) error {
	r := viewReader{b: b, ok: true}
	v.eventID = r.bytes()
	v.entityID = r.bytes()
	v.eventTime = r.long()
	v.windows = v.windows[:0]
	for r.ok {
		n := r.long()
		if n == 0 {
			break
		}
		if n < 0 {
			n = -n
			r.long() // block size in bytes
		}
		if n > int64(len(b)) {
			r.ok = false
			break
		}
		for ; n > 0 && r.ok; n-- {
			v.windows = append(v.windows, windowView{
				name: r.bytes(), windowMs: r.long(), bucketMs: r.long(),
				count: r.long(), sumMinor: r.long(), minMinor: r.long(), maxMinor: r.long(),
			})
		}
	}
	switch u := r.long(); u {
	case 0:
		v.hasPrevious, v.msSincePrevious = false, 0
	case 1:
		v.hasPrevious, v.msSincePrevious = true, r.long()
	default:
		r.ok = false
	}
	if r.ok && r.i < len(b) && b[r.i] <= 1 {
		v.late = b[r.i] == 1
		r.i++
	} else {
		r.ok = false
	}
	v.sourceTopic = r.bytes()
	v.sourcePartition = int32(r.long())
	v.sourceOffset = r.long()
	if !r.ok || r.i != len(b) {
		return fmt.Errorf("%w at byte %d of %d", errBadValue, r.i, len(b))
	}
	return nil
}

type viewReader struct {
	b  []byte
	i  int
	ok bool
}

func (r *viewReader) long() int64 {
	if !r.ok {
		return 0
	}
	var u uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if r.i >= len(r.b) {
			r.ok = false
			return 0
		}
		c := r.b[r.i]
		r.i++
		u |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int64(u>>1) ^ -int64(u&1)
		}
	}
	r.ok = false
	return 0
}

func (r *viewReader) bytes() []byte {
	n := r.long()
	if !r.ok || n < 0 || n > int64(len(r.b)-r.i) {
		r.ok = false
		return nil
	}
	s := r.b[r.i : r.i+int(n) : r.i+int(n)]
	r.i += int(n)
	return s
}
