package repartition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"unicode/utf8"
)

// Snapshot image, versions 1 and 2 (varint is zigzag, string a uvarint length and
// bytes):
//
//	"VRPM", u8 version (1: the clock is NoClock; 2: it is not)
//	uvarint sources, uvarint ext words, varint F
//	version 2: varint clock
//	uvarint topic count, each topic a string, in the order of first use below
//	per source, in partition order:
//	  varint watermark, uvarint epoch,
//	  u8 idle: 0 not idle, 1 idle without a lease, 2 (version 2) idle with a lease,
//	    then varint lease end (at least the clock, below math.MaxInt64)
//	  uvarint pending count, each in (t, offset) order:
//	    varint t, uvarint offset, varint amount, uvarint topic index,
//	    string key, string event id, ext words × u64 little-endian
//	  uvarint counted-above-watermark count, each in (t, offset) order:
//	    varint t, uvarint offset
//	u32 CRC-32C (Castagnoli) of every byte before it, little-endian
//
// The topic table keeps the topic name, the same in nearly every event, out of the
// entries. Every field is written in one canonical way and Restore refuses anything
// else, so Restore(b) followed by AppendSnapshot gives back b.
const (
	snapMagic = "VRPM"
	// snapVersion is the newest version; a Merger whose clock is NoClock (replay,
	// and every Merger before leases) writes version 1, which older builds read.
	snapVersion = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot wraps every reason Restore refuses an image.
var ErrSnapshot = errors.New("repartition: bad merger snapshot")

// AppendSnapshot appends the Merger's state to dst. The bytes depend only on the
// logical state, never on buffer layout or history, so two Mergers that will release
// the same events write the same image. It may be taken at any point, also between an
// Offer that raised the frontier and the Ready that releases.
func (m *Merger) AppendSnapshot(dst []byte) []byte {
	start := len(dst)
	dst = append(dst, snapMagic...)
	if m.clock == NoClock {
		dst = append(dst, 1)
	} else {
		dst = append(dst, snapVersion)
	}
	dst = binary.AppendUvarint(dst, uint64(len(m.src)))
	dst = binary.AppendUvarint(dst, uint64(m.n))
	dst = binary.AppendVarint(dst, m.F)
	if m.clock != NoClock {
		dst = binary.AppendVarint(dst, m.clock)
	}
	topics := m.topicTable()
	dst = binary.AppendUvarint(dst, uint64(len(topics)))
	for _, t := range topics {
		dst = appendString(dst, t)
	}
	for i := range m.src {
		s := &m.src[i]
		dst = binary.AppendVarint(dst, s.wm)
		dst = binary.AppendUvarint(dst, s.epoch)
		switch {
		case !s.idle:
			dst = append(dst, 0)
		case s.lease == noLease:
			dst = append(dst, 1)
		default:
			dst = append(dst, 2)
			dst = binary.AppendVarint(dst, s.lease)
		}
		dst = binary.AppendUvarint(dst, uint64(s.pending()))
		s.each(m.n, func(e *entry, ext []uint64) {
			dst = binary.AppendVarint(dst, e.t)
			dst = binary.AppendUvarint(dst, uint64(e.off))
			dst = binary.AppendVarint(dst, e.amount)
			dst = binary.AppendUvarint(dst, uint64(indexOf(topics, e.topic)))
			dst = appendString(dst, e.key)
			dst = appendString(dst, e.id)
			for _, w := range ext {
				dst = binary.LittleEndian.AppendUint64(dst, w)
			}
		})
		dst = binary.AppendUvarint(dst, uint64(len(s.rel)-s.rh))
		for _, k := range s.rel[s.rh:] {
			dst = binary.AppendVarint(dst, k.t)
			dst = binary.AppendUvarint(dst, uint64(k.off))
		}
	}
	return binary.LittleEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// topicTable lists the pending events' topics in the order AppendSnapshot meets them.
// There are very few (one input topic), so a linear search is the fastest set.
func (m *Merger) topicTable() []string {
	var topics []string
	for i := range m.src {
		m.src[i].each(m.n, func(e *entry, _ []uint64) {
			if indexOf(topics, e.topic) < 0 {
				topics = append(topics, e.topic)
			}
		})
	}
	return topics
}

func indexOf(list []string, s string) int {
	for i, t := range list {
		if t == s {
			return i
		}
	}
	return -1
}

// Restore rebuilds a Merger from an AppendSnapshot image made with the same Config.
// It refuses, with an error wrapping ErrSnapshot, anything it cannot fully validate:
// a checksum mismatch, another version or Config, a non-canonical field, events out
// of order or breaking the hop's rules. It never panics and never returns a
// half-loaded Merger.
func Restore(cfg Config, data []byte) (*Merger, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrSnapshot, fmt.Sprintf(format, args...))
	}
	if len(data) < len(snapMagic)+1+4 || string(data[:len(snapMagic)]) != snapMagic {
		return nil, bad("not a merger snapshot")
	}
	version := data[len(snapMagic)]
	if version != 1 && version != snapVersion {
		return nil, bad("version %d, this build reads 1 and %d", version, snapVersion)
	}
	body := data[:len(data)-4]
	if got, want := crc32.Checksum(body, castagnoli), binary.LittleEndian.Uint32(data[len(body):]); got != want {
		return nil, bad("checksum %08x, image says %08x", got, want)
	}
	rd := reader{b: body, i: len(snapMagic) + 1}
	if n := rd.uvarint(); rd.err == nil && n != uint64(cfg.Sources) {
		return nil, bad("%d sources, configured %d", n, cfg.Sources)
	}
	if n := rd.uvarint(); rd.err == nil && n != uint64(cfg.ExtWords) {
		return nil, bad("%d feature words, configured %d", n, cfg.ExtWords)
	}
	m, _ := New(cfg)
	m.F = rd.varint()
	if version >= 2 {
		if m.clock = rd.varint(); rd.err == nil && m.clock == NoClock {
			return nil, bad("version %d with no clock (version 1 is the canonical form)", version)
		}
	}
	nt := rd.uvarint()
	if rd.err == nil && nt > uint64(len(body)-rd.i) {
		return nil, bad("%d topics in %d bytes", nt, len(body)-rd.i)
	}
	var topics []string
	for range nt {
		t := rd.bytes(MaxTopicBytes, ErrTopic)
		if rd.err != nil {
			break
		}
		if !utf8.Valid(t) || indexOf(topics, string(t)) >= 0 {
			return nil, bad("topic %q invalid or listed twice", t)
		}
		topics = append(topics, string(t))
	}
	used := 0 // topics[:used] have been met; the next new one must be topics[used]
	n := m.n
	minEntry := 6 + 8*n // the smallest pending entry: six one-byte fields and the words
	for p := range m.src {
		if rd.err != nil {
			break
		}
		s := &m.src[p]
		s.wm = rd.varint()
		s.epoch = rd.uvarint()
		if rd.err != nil {
			break
		}
		if rd.i >= len(body) || body[rd.i] > 2 || body[rd.i] == 2 && version < 2 {
			return nil, bad("source %d: idle flag %d", p, body[min(rd.i, len(body)-1)])
		}
		s.idle = body[rd.i] != 0
		leased := body[rd.i] == 2
		rd.i++
		if leased {
			s.lease = rd.varint()
			if rd.err != nil {
				break
			}
			if s.lease < m.clock || s.lease == noLease {
				return nil, bad("source %d: lease end %d before the clock %d, or reserved", p, s.lease, m.clock)
			}
			m.expiry = min(m.expiry, s.lease)
		}
		np := rd.uvarint()
		if rd.err == nil && np > uint64((len(body)-rd.i)/minEntry) {
			return nil, bad("source %d: %d pending events in %d bytes", p, np, len(body)-rd.i)
		}
		if rd.err == nil {
			s.q = make([]entry, 0, np)
			s.ext = make([]uint64, 0, int(np)*n)
		}
		for range np {
			var e entry
			e.t = rd.varint()
			off := rd.uvarint()
			e.amount = rd.varint()
			ti := rd.uvarint()
			key := rd.bytes(MaxKeyBytes, ErrKey)
			id := rd.bytes(MaxEventIDBytes, ErrEventID)
			if rd.err != nil {
				break
			}
			switch {
			case e.t > MaxEventTime:
				return nil, bad("source %d: pending event time %d is reserved", p, e.t)
			case off > math.MaxInt64:
				return nil, bad("source %d: pending offset %d out of range", p, off)
			case ti > uint64(used) || ti >= uint64(len(topics)):
				return nil, bad("source %d: topic index %d out of order", p, ti)
			case len(key) == 0 || !utf8.Valid(key):
				return nil, bad("source %d: pending key invalid", p)
			case len(id) == 0 || !utf8.Valid(id):
				return nil, bad("source %d: pending event id invalid", p)
			}
			if ti == uint64(used) {
				used++
			}
			e.off, e.topic, e.key, e.id = int64(off), topics[ti], string(key), string(id)
			if k := len(s.q); k > 0 && !less(s.q[k-1].t, s.q[k-1].off, e.t, e.off) {
				return nil, bad("source %d: pending events out of order at (%d, %d)", p, e.t, e.off)
			}
			if len(body)-rd.i < 8*n {
				rd.err = ErrTruncated
				break
			}
			for range n {
				s.ext = append(s.ext, binary.LittleEndian.Uint64(body[rd.i:]))
				rd.i += 8
			}
			s.q = append(s.q, e)
		}
		m.pending += len(s.q)
		nr := rd.uvarint()
		if rd.err == nil && nr > uint64(len(body)-rd.i)/2 {
			return nil, bad("source %d: %d counted keys in %d bytes", p, nr, len(body)-rd.i)
		}
		for range nr {
			t := rd.varint()
			off := rd.uvarint()
			if rd.err != nil {
				break
			}
			if off > math.MaxInt64 {
				return nil, bad("source %d: counted offset %d out of range", p, off)
			}
			k := relKey{t, int64(off)}
			if t < s.wm || t >= m.F {
				return nil, bad("source %d: counted key (%d, %d) outside [watermark %d, frontier %d)", p, k.t, k.off, s.wm, m.F)
			}
			if j := len(s.rel); j > 0 && !less(s.rel[j-1].t, s.rel[j-1].off, k.t, k.off) {
				return nil, bad("source %d: counted keys out of order at (%d, %d)", p, k.t, k.off)
			}
			s.rel = append(s.rel, k)
		}
		if len(s.q) > 0 && s.q[0].t < m.F {
			m.dirty = true // waiting for the Ready the snapshot was taken before
		}
	}
	if rd.err != nil {
		return nil, bad("%v at byte %d", rd.err, rd.i)
	}
	m.minWM, _ = m.activeMin()
	if used != len(topics) {
		return nil, bad("%d topics listed, %d used", len(topics), used)
	}
	if rd.i != len(body) {
		return nil, bad("%d bytes after the last source", len(body)-rd.i)
	}
	return m, nil
}
