package repartition

import (
	"encoding/binary"
	"errors"
	"math"
	"strconv"
	"unicode/utf8"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// Kind tells a hop event from a marker.
type Kind uint8

const (
	// KindEvent is one input transaction that has this group's key.
	KindEvent Kind = 1
	// KindMarker carries only a source partition's watermark (and whether that
	// partition is idle), for a repartition partition the source had no event for.
	KindMarker Kind = 2
)

func (k Kind) String() string {
	switch k {
	case KindEvent:
		return "event"
	case KindMarker:
		return "marker"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// RecordVersion is the first byte of every hop record value this package writes.
// A decoder refuses any other value, so a format change is a new version that old
// binaries reject loudly instead of misreading.
const RecordVersion = 1

// Limits of the hop record. Key and event id follow the data contract's limits for
// entity and event ids; a topic name is at most 249 bytes in Kafka.
const (
	MaxKeyBytes     = codec.MaxEntityIDBytes
	MaxEventIDBytes = codec.MaxEventIDBytes
	MaxTopicBytes   = 249
	// MaxExtWords is one filter word plus 32 distinct-value hashes (codec.Transaction.Ext).
	MaxExtWords = 33
	// MaxEventTime is the largest event time an event may carry. math.MaxInt64 is
	// reserved so that "every event strictly below t+1" never overflows; a marker may
	// carry math.MaxInt64 as its watermark, meaning the source will send nothing more.
	MaxEventTime = math.MaxInt64 - 1
)

// NoWatermark is the watermark of a source that has promised nothing yet: every
// event time is at or above it.
const NoWatermark = math.MinInt64

// Event is one input transaction as the second stage needs it: the group's key, the
// lineage of the source record, and what the group's features read.
type Event struct {
	Source    int32  // source (input) partition
	Offset    int64  // source offset; (Source, Offset) identifies the transaction
	EventTime int64  // Unix ms, as decided at the source
	Topic     string // source (input) topic
	Key       string // this group's key, non-empty
	EventID   string
	Amount    int64    // minor units
	Ext       []uint64 // the group's feature words (codec.Transaction.Ext layout)
}

// Record is one hop record value: an event or a marker from one source partition.
//
// Watermark is a promise from the sender: every event this source partition sends
// after this record has EventTime >= Watermark. For an event it is also at most the
// event's own time (EventWatermark computes it); the encoder and decoder refuse an
// event whose Watermark is above its EventTime, because attaching the stage's
// watermark to every event of a released batch would break the promise for the
// events after the first.
//
// Epoch is the sender's owner epoch for the source partition (the checkpoint store's
// claim, 0 when there is none); the merger honours an idle marker only from the
// newest epoch it has seen, so a frozen old owner that wakes up cannot declare a
// partition idle that its new owner is feeding.
type Record struct {
	Kind      Kind
	Epoch     uint64
	Watermark int64
	Idle      bool // markers only: the source partition's input has been idle for the idle timeout
	// Lease is, on an idle marker, how long the declaration holds without being
	// renewed, in milliseconds of the repartition partition's record timestamps
	// (LogTime): a source whose owner is lost stops renewing, and the second stage
	// counts it in its order again once the other sources' records show the lease
	// has run out. 0: the declaration holds until the source sends anything else
	// (replay's end of input, and the idle markers written before leases).
	Lease int64
	// LogTime is the Kafka timestamp of the record that carried this value (Unix
	// ms; 0 or less: none). It is not part of the value: the second stage sets it
	// after Decode, and the Merger's clock is the largest seen.
	LogTime int64
	Event   // Source is set for markers too; the rest only for events
}

// MaxLease bounds Record.Lease: a day.
const MaxLease = 24 * 60 * 60 * 1000

// EventWatermark is the watermark a hop event carries: min(its event time, the
// source stage's watermark). The first stage (pkg/pipeline) hops an event when its
// input partition accepts it, with the watermark after that acceptance, which is at
// most the event's time, so the min is the watermark. The promise holds because every
// event accepted later is at or above the watermark at its own acceptance, and the
// watermark only rises. A stage with no watermark yet passes NoWatermark.
func EventWatermark(eventTime, stageWatermark int64) int64 {
	return min(eventTime, stageWatermark)
}

// Errors of AppendRecord and Decoder.Decode. Decode wraps them with the byte position.
var (
	ErrVersion    = errors.New("repartition: unknown record version")
	ErrKind       = errors.New("repartition: unknown record kind")
	ErrTruncated  = errors.New("repartition: record truncated")
	ErrTrailing   = errors.New("repartition: bytes after the record")
	ErrVarint     = errors.New("repartition: malformed or non-minimal varint")
	ErrSource     = errors.New("repartition: source partition out of range")
	ErrOffset     = errors.New("repartition: source offset negative")
	ErrEventTime  = errors.New("repartition: event time math.MaxInt64 is reserved")
	ErrWatermark  = errors.New("repartition: event watermark above its event time")
	ErrKey        = errors.New("repartition: key empty, too long or not UTF-8")
	ErrEventID    = errors.New("repartition: event id empty, too long or not UTF-8")
	ErrTopic      = errors.New("repartition: topic too long or not UTF-8")
	ErrExtWords   = errors.New("repartition: too many feature words")
	ErrMarkerFlag = errors.New("repartition: unknown marker flag")
	ErrLease      = errors.New("repartition: lease on a marker that is not idle, or out of 1..MaxLease ms")
)

// DecodeError is a refused record value: which rule, at which byte.
type DecodeError struct {
	Err error
	At  int
}

func (e *DecodeError) Error() string { return e.Err.Error() + " at byte " + strconv.Itoa(e.At) }
func (e *DecodeError) Unwrap() error { return e.Err }

// Marker flags. A lease follows the flags byte only when markerLeased is set, and
// only an idle marker has one.
const (
	markerIdle   = 1 // bit 0
	markerLeased = 2 // bit 1: a uvarint lease in ms follows
)

// minInt64Bits is math.MinInt64's two's-complement bits: uint64(t) − minInt64Bits is
// the distance from math.MinInt64 up to t.
const minInt64Bits = uint64(1) << 63

// AppendRecord appends r's value to dst (format in docs/repartition.md):
//
//	u8 version (1), u8 kind
//	event:  uvarint epoch, uvarint source, uvarint offset, varint event_time,
//	        uvarint event_time − watermark, varint amount,
//	        string topic, string key, string event_id,
//	        uvarint n, n × u64 little-endian feature words
//	marker: uvarint epoch, uvarint source, varint watermark, u8 flags (bit 0: idle,
//	        bit 1: leased), then with bit 1 a uvarint lease in ms
//
// varint is zigzag, as in Avro; string is a uvarint length and the bytes. Encoding
// is canonical (one value, one byte string) and does not allocate when dst has room.
// It refuses what Decode would refuse, so nothing it writes is unreadable.
func AppendRecord(dst []byte, r *Record) ([]byte, error) {
	if err := checkCommon(r); err != nil {
		return dst, err
	}
	switch r.Kind {
	case KindEvent:
		if err := checkEvent(r); err != nil {
			return dst, err
		}
		dst = append(dst, RecordVersion, byte(KindEvent))
		dst = binary.AppendUvarint(dst, r.Epoch)
		dst = binary.AppendUvarint(dst, uint64(r.Source))
		dst = binary.AppendUvarint(dst, uint64(r.Offset))
		dst = binary.AppendVarint(dst, r.EventTime)
		dst = binary.AppendUvarint(dst, uint64(r.EventTime)-uint64(r.Watermark))
		dst = binary.AppendVarint(dst, r.Amount)
		dst = appendString(dst, r.Topic)
		dst = appendString(dst, r.Key)
		dst = appendString(dst, r.EventID)
		dst = binary.AppendUvarint(dst, uint64(len(r.Ext)))
		for _, w := range r.Ext {
			dst = binary.LittleEndian.AppendUint64(dst, w)
		}
		return dst, nil
	case KindMarker:
		if r.Lease != 0 && (!r.Idle || r.Lease < 0 || r.Lease > MaxLease) {
			return dst, ErrLease
		}
		dst = append(dst, RecordVersion, byte(KindMarker))
		dst = binary.AppendUvarint(dst, r.Epoch)
		dst = binary.AppendUvarint(dst, uint64(r.Source))
		dst = binary.AppendVarint(dst, r.Watermark)
		var flags byte
		if r.Idle {
			flags |= markerIdle
		}
		if r.Lease != 0 {
			flags |= markerLeased
			return binary.AppendUvarint(append(dst, flags), uint64(r.Lease)), nil
		}
		return append(dst, flags), nil
	}
	return dst, ErrKind
}

func checkCommon(r *Record) error {
	if r.Source < 0 {
		return ErrSource
	}
	return nil
}

// checkEvent holds the rules Decode applies to an event's fields.
func checkEvent(r *Record) error {
	switch {
	case r.Offset < 0:
		return ErrOffset
	case r.EventTime > MaxEventTime:
		return ErrEventTime
	case r.Watermark > r.EventTime:
		return ErrWatermark
	case !validString(r.Topic, 0, MaxTopicBytes):
		return ErrTopic
	case !validString(r.Key, 1, MaxKeyBytes):
		return ErrKey
	case !validString(r.EventID, 1, MaxEventIDBytes):
		return ErrEventID
	case len(r.Ext) > MaxExtWords:
		return ErrExtWords
	}
	return nil
}

func validString(s string, minLen, maxLen int) bool {
	return len(s) >= minLen && len(s) <= maxLen && utf8.ValidString(s)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decoder decodes hop record values. It keeps the last topic name it decoded so that
// the topic, the same in nearly every record, costs no allocation: a decoded event
// allocates one string that its key and event id share (and Ext when r.Ext has no
// room).
// The zero value is ready; not safe for concurrent use.
type Decoder struct {
	topic string
}

// Decode decodes b into r, or refuses it with a *DecodeError naming the rule and the
// byte. It accepts exactly what AppendRecord writes: canonical varints only, no
// trailing bytes, every field rule of AppendRecord. r.Ext reuses its backing array.
// On error r is left in an unspecified state.
func (d *Decoder) Decode(b []byte, r *Record) error {
	rd := reader{b: b}
	if len(b) < 2 {
		return &DecodeError{ErrTruncated, len(b)}
	}
	if b[0] != RecordVersion {
		return &DecodeError{ErrVersion, 0}
	}
	kind := Kind(b[1])
	rd.i = 2
	ext := r.Ext[:0]
	*r = Record{Kind: kind}
	epoch := rd.uvarint()
	src := rd.uvarint()
	if rd.err == nil && src > math.MaxInt32 {
		return &DecodeError{ErrSource, rd.i}
	}
	r.Epoch, r.Source = epoch, int32(src)
	switch kind {
	case KindEvent:
		off := rd.uvarint()
		if rd.err == nil && off > math.MaxInt64 {
			return &DecodeError{ErrOffset, rd.i}
		}
		r.Offset = int64(off)
		r.EventTime = rd.varint()
		if rd.err == nil && r.EventTime > MaxEventTime {
			return &DecodeError{ErrEventTime, rd.i}
		}
		lag := rd.uvarint()
		// The watermark is EventTime − lag and must not go below math.MinInt64.
		if rd.err == nil && lag > uint64(r.EventTime)-minInt64Bits {
			return &DecodeError{ErrWatermark, rd.i}
		}
		r.Watermark = int64(uint64(r.EventTime) - lag)
		r.Amount = rd.varint()
		topic := rd.bytes(MaxTopicBytes, ErrTopic)
		if rd.err == nil {
			if string(topic) != d.topic { // compared without allocating
				if !utf8.Valid(topic) {
					return &DecodeError{ErrTopic, rd.i}
				}
				d.topic = string(topic)
			}
			r.Topic = d.topic
		}
		key := rd.bytes(MaxKeyBytes, ErrKey)
		if rd.err == nil && (len(key) == 0 || !utf8.Valid(key)) {
			return &DecodeError{ErrKey, rd.i}
		}
		keyAt := rd.i - len(key)
		id := rd.bytes(MaxEventIDBytes, ErrEventID)
		if rd.err == nil {
			if len(id) == 0 || !utf8.Valid(id) {
				return &DecodeError{ErrEventID, rd.i}
			}
			// One allocation for both strings: the key's bytes, the event id's
			// length and the event id lie next to each other, and the two live
			// as long as each other (the Merger holds the event until it is
			// released; the window table copies a key it keeps).
			both := string(b[keyAt:rd.i])
			r.Key, r.EventID = both[:len(key)], both[len(both)-len(id):]
		}
		n := rd.uvarint()
		if rd.err == nil && n > MaxExtWords {
			return &DecodeError{ErrExtWords, rd.i}
		}
		if rd.err == nil && uint64(len(b)-rd.i) < n*8 {
			return &DecodeError{ErrTruncated, len(b)}
		}
		if rd.err == nil {
			for range n {
				ext = append(ext, binary.LittleEndian.Uint64(b[rd.i:]))
				rd.i += 8
			}
		}
		r.Ext = ext
	case KindMarker:
		r.Watermark = rd.varint()
		if rd.err == nil {
			if rd.i >= len(b) {
				return &DecodeError{ErrTruncated, rd.i}
			}
			flags := b[rd.i]
			if flags&^(markerIdle|markerLeased) != 0 {
				return &DecodeError{ErrMarkerFlag, rd.i}
			}
			r.Idle = flags&markerIdle != 0
			rd.i++
			if flags&markerLeased != 0 {
				if !r.Idle {
					return &DecodeError{ErrLease, rd.i - 1}
				}
				lease := rd.uvarint()
				if rd.err == nil && (lease == 0 || lease > MaxLease) {
					return &DecodeError{ErrLease, rd.i}
				}
				r.Lease = int64(lease)
			}
		}
		r.Ext = ext
	default:
		return &DecodeError{ErrKind, 1}
	}
	if rd.err != nil {
		return &DecodeError{rd.err, rd.i}
	}
	if rd.i != len(b) {
		return &DecodeError{ErrTrailing, rd.i}
	}
	return nil
}

// reader reads canonical varints and length-prefixed bytes; after the first error
// every read returns zero and err keeps that first error (and i its position).
type reader struct {
	b   []byte
	i   int
	err error
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.i:])
	switch {
	case n == 0:
		r.err = ErrTruncated
		r.i = len(r.b)
		return 0
	case n < 0:
		r.err = ErrVarint
		return 0
	case n > 1 && r.b[r.i+n-1] == 0: // a minimal varint never ends in a zero byte
		r.err = ErrVarint
		return 0
	}
	r.i += n
	return v
}

func (r *reader) varint() int64 {
	u := r.uvarint()
	return int64(u>>1) ^ -int64(u&1)
}

func (r *reader) bytes(maxLen int, tooLong error) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(maxLen) {
		r.err = tooLong
		return nil
	}
	if uint64(len(r.b)-r.i) < n {
		r.err = ErrTruncated
		r.i = len(r.b)
		return nil
	}
	s := r.b[r.i : r.i+int(n)]
	r.i += int(n)
	return s
}

// PeekWatermark returns the kind and the watermark of hop record b without decoding
// the rest: for a caller that routes records it wrote itself by their promise (replay
// keeps a source's hops for later and feeds them as far as its frontier needs). It
// reads the fields up to the watermark with Decode's rules and refuses what Decode
// refuses there; it does not check the fields after it, so a record it accepts may
// still be one Decode refuses.
func PeekWatermark(b []byte) (Kind, int64, error) {
	if len(b) < 2 {
		return 0, 0, &DecodeError{ErrTruncated, len(b)}
	}
	if b[0] != RecordVersion {
		return 0, 0, &DecodeError{ErrVersion, 0}
	}
	rd := reader{b: b, i: 2}
	rd.uvarint() // epoch
	if src := rd.uvarint(); rd.err == nil && src > math.MaxInt32 {
		return 0, 0, &DecodeError{ErrSource, rd.i}
	}
	var w int64
	switch kind := Kind(b[1]); kind {
	case KindEvent:
		if off := rd.uvarint(); rd.err == nil && off > math.MaxInt64 {
			return 0, 0, &DecodeError{ErrOffset, rd.i}
		}
		t := rd.varint()
		if rd.err == nil && t > MaxEventTime {
			return 0, 0, &DecodeError{ErrEventTime, rd.i}
		}
		lag := rd.uvarint()
		if rd.err == nil && lag > uint64(t)-minInt64Bits {
			return 0, 0, &DecodeError{ErrWatermark, rd.i}
		}
		w = int64(uint64(t) - lag)
	case KindMarker:
		w = rd.varint()
	default:
		return 0, 0, &DecodeError{ErrKind, 1}
	}
	if rd.err != nil {
		return 0, 0, &DecodeError{rd.err, rd.i}
	}
	return Kind(b[1]), w, nil
}
