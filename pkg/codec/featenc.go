package codec

import (
	"slices"
	"unsafe"
)

// FeaturesEncoder is AppendFeatures for a caller that encodes record after record
// with the same windows, source topic and partition, as a partition's processor
// does: the bytes those fields give (each window's name, window_ms and bucket_ms,
// the windows' count, the topic and partition) are encoded once and copied into
// each record, leaving the per-event fields to encode. Append checks every record's
// constant fields against what it encoded and encodes them again when they differ,
// so its bytes are AppendFeatures' for any record. The zero value is ready to use;
// it is not safe for concurrent use.
type FeaturesEncoder struct {
	heads     []windowHead
	count     [maxLongLen]byte // the windows' count as a varint
	countLen  int
	topic     string
	partition int32
	source    []byte // topic and partition, encoded
	valid     bool
}

// windowHead is one window's constant fields and their encoding; short (every
// window name this service writes) encodings also sit in fixed, copied as a
// whole array.
type windowHead struct {
	name               string
	windowMs, bucketMs int64
	enc                []byte
	fixed              [windowHeadFixed]byte
}

const windowHeadFixed = 24

// Append appends f to dst in Avro binary (VelocityFeatures schema), the bytes
// AppendFeatures(dst, f) gives.
func (e *FeaturesEncoder) Append(dst []byte, f *Features) []byte {
	if !e.matches(f) {
		e.prepare(f)
	}
	n := len(dst)
	dst = slices.Grow(dst, maxFeaturesLen(f))
	b := dst[n:cap(dst)]
	i := putString(b, 0, f.EventID)
	i = putString(b, i, f.EntityID)
	i = putLong(b, i, f.EventTime)
	if len(f.Windows) > 0 {
		i += copy(b[i:], e.count[:e.countLen])
		for k := range f.Windows {
			w, h := &f.Windows[k], &e.heads[k]
			// Room: maxFeaturesLen counts the name and six longs for a window,
			// more than the fixed array whenever the encoding fits in it.
			if len(h.enc) <= windowHeadFixed && i+windowHeadFixed <= len(b) {
				*(*[windowHeadFixed]byte)(b[i : i+windowHeadFixed]) = h.fixed
				i += len(h.enc)
			} else {
				i += copy(b[i:], h.enc)
			}
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
	i++
	i += copy(b[i:], e.source)
	i = putLong(b, i, f.SourceOffset)
	return dst[:n+i]
}

// matches reports whether f's constant fields are those e encoded.
func (e *FeaturesEncoder) matches(f *Features) bool {
	if !e.valid || len(f.Windows) != len(e.heads) || f.SourcePartition != e.partition || !sameString(f.SourceTopic, e.topic) {
		return false
	}
	for k := range f.Windows {
		w, h := &f.Windows[k], &e.heads[k]
		if w.WindowMs != h.windowMs || w.BucketMs != h.bucketMs || !sameString(w.Name, h.name) {
			return false
		}
	}
	return true
}

// sameString is a == b, without reading the bytes when both are the same string
// (a processor's window names and topic are).
func sameString(a, b string) bool {
	return len(a) == len(b) && (unsafe.StringData(a) == unsafe.StringData(b) || a == b)
}

// prepare encodes f's constant fields.
func (e *FeaturesEncoder) prepare(f *Features) {
	e.heads = e.heads[:0]
	for k := range f.Windows {
		w := &f.Windows[k]
		h := windowHead{name: w.Name, windowMs: w.WindowMs, bucketMs: w.BucketMs}
		h.enc = AppendString(nil, w.Name)
		h.enc = AppendLong(h.enc, w.WindowMs)
		h.enc = AppendLong(h.enc, w.BucketMs)
		copy(h.fixed[:], h.enc)
		e.heads = append(e.heads, h)
	}
	e.countLen = putLong(e.count[:], 0, int64(len(f.Windows)))
	e.topic, e.partition = f.SourceTopic, f.SourcePartition
	// An Avro int is the same zig-zag varint as a long with a 32-bit range.
	e.source = AppendLong(AppendString(e.source[:0], f.SourceTopic), int64(f.SourcePartition))
	e.valid = true
}
