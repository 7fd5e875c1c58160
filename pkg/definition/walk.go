package definition

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/linkedin/goavro/v2"
)

// The Avro binary walker. It reads one value of a compiled writer schema,
// storing the fields a definition maps and skipping the rest. It is strict
// where goavro is lax (a varint longer than 10 bytes or overflowing 64 bits,
// an int outside 32 bits): a record that only decodes by dropping bits is
// corrupt. Everywhere else it accepts exactly what goavro accepts; the
// differential tests hold it to that.

type walkErr uint8

const (
	errNone walkErr = iota
	errTruncated
	errVarintOverflow
	errNegativeLength
	errLengthBeyondRecord
	errBadBoolean
	errBadUnionIndex
	errBadEnumIndex
	errIntOverflow
	errBlockCount
	errTooDeep
	errDuplicateKey
)

func (e walkErr) String() string {
	switch e {
	case errTruncated:
		return "truncated"
	case errVarintOverflow:
		return "varint longer than 10 bytes or overflowing 64 bits"
	case errNegativeLength:
		return "negative length prefix"
	case errLengthBeyondRecord:
		return "length prefix beyond the end of the record"
	case errBadBoolean:
		return "boolean byte is neither 0 nor 1"
	case errBadUnionIndex:
		return "union branch index out of range"
	case errBadEnumIndex:
		return "enum index out of range"
	case errIntOverflow:
		return "int value overflows 32 bits"
	case errBlockCount:
		return "array or map block count out of range"
	case errDuplicateKey:
		return "map has a duplicate key"
	case errTooDeep:
		return "nesting deeper than " + strconv.Itoa(maxDepth)
	}
	return "ok"
}

// maxDepth bounds nesting of a recursive writer schema (a linked list through
// a union), so that a hostile record cannot exhaust the stack.
const maxDepth = 256

// maxBlockCount mirrors goavro's bound on items in one array or map block
// (pkg/codec lowers it at init; read here after that).
func maxBlockCount() int64 { return int64(goavro.MaxBlockCount) }

func readLong(b []byte, i int) (int64, int, walkErr) {
	if i < len(b) && b[i] < 0x80 {
		u := uint64(b[i])
		return int64(u>>1) ^ -int64(u&1), i + 1, errNone
	}
	var u uint64
	var shift uint
	for n := 0; n < 10; n++ {
		if i >= len(b) {
			return 0, i, errTruncated
		}
		c := b[i]
		i++
		if n == 9 && c > 1 {
			return 0, i, errVarintOverflow
		}
		u |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return int64(u>>1) ^ -int64(u&1), i, errNone
		}
		shift += 7
	}
	return 0, i, errVarintOverflow
}

func readInt(b []byte, i int) (int64, int, walkErr) {
	v, j, e := readLong(b, i)
	if e == errNone && (v < math.MinInt32 || v > math.MaxInt32) {
		return 0, i, errIntOverflow
	}
	return v, j, e
}

// readLen reads a length prefix and checks that many bytes follow.
func readLen(b []byte, i int) (int, int, walkErr) {
	n, j, err := readLong(b, i)
	if err != errNone {
		return 0, j, err
	}
	if n < 0 {
		return 0, i, errNegativeLength
	}
	if n > int64(len(b)-j) {
		return 0, i, errLengthBeyondRecord
	}
	return int(n), j, errNone
}

// val is one mapped field of the record being decoded: set when the field was
// reached and not null. n holds a boolean (0/1), int, long, enum ordinal, or
// float/double bits; off and ln locate bytes, string, fixed and decimal
// contents in the value.
type val struct {
	n   int64
	off uint32
	ln  uint32
	set bool
}

type stepOp uint8

const (
	stepSkip stepOp = iota
	stepLeaf
	stepRecord
)

// step is what the walker does with one field of a record.
type step struct {
	op       stepOp
	typ      *node // skip: the field's type; leaf: its non-null type
	kind     kind  // leaf: typ.kind, size and symbol count, kept here so that
	size     int   // reading a leaf does not chase typ
	nsym     int64
	nullable bool  // the field is a [null, T] union: read the branch first
	nullIdx  int64 // that union's null branch
	slot     int   // leaf: where the value goes; record: -1, or the slot that records its presence
	sub      *plan // record: the nested record's steps
	label    string
}

type plan struct {
	steps []step
}

// walk reads one record of pl at b[i:]; on failure it names the field.
func walk(b []byte, i int, pl *plan, vals []val, depth int) (int, walkErr, string) {
	if depth > maxDepth {
		return i, errTooDeep, ""
	}
	for k := range pl.steps {
		st := &pl.steps[k]
		if st.op == stepSkip {
			j, e := skip(b, i, st.typ, depth)
			if e != errNone {
				return j, e, st.label
			}
			i = j
			continue
		}
		if st.nullable {
			idx, j, e := readLong(b, i)
			if e != errNone {
				return j, e, st.label
			}
			if idx != 0 && idx != 1 {
				return i, errBadUnionIndex, st.label
			}
			i = j
			if idx == st.nullIdx {
				continue
			}
		}
		var e walkErr
		if st.op == stepRecord {
			if st.slot >= 0 {
				vals[st.slot].set = true
			}
			var lbl string
			if i, e, lbl = walk(b, i, st.sub, vals, depth+1); e != errNone {
				return i, e, lbl
			}
			continue
		}
		if i, e = readLeaf(b, i, st, &vals[st.slot]); e != errNone {
			return i, e, st.label
		}
	}
	return i, errNone, ""
}

func readLeaf(b []byte, i int, st *step, v *val) (int, walkErr) {
	var e walkErr
	switch st.kind {
	case kBoolean:
		if i >= len(b) {
			return i, errTruncated
		}
		if b[i] > 1 {
			return i, errBadBoolean
		}
		v.n = int64(b[i])
		i++
	case kInt:
		v.n, i, e = readInt(b, i)
	case kLong:
		v.n, i, e = readLong(b, i)
	case kEnum:
		v.n, i, e = readLong(b, i)
		if e == errNone && (v.n < 0 || v.n >= st.nsym) {
			return i, errBadEnumIndex
		}
	case kFloat:
		if len(b)-i < 4 {
			return i, errTruncated
		}
		v.n = int64(math.Float64bits(float64(math.Float32frombits(binary.LittleEndian.Uint32(b[i:])))))
		i += 4
	case kDouble:
		if len(b)-i < 8 {
			return i, errTruncated
		}
		v.n = int64(binary.LittleEndian.Uint64(b[i:]))
		i += 8
	case kBytes, kString:
		var ln, j int
		if ln, j, e = readLen(b, i); e != errNone {
			return j, e
		}
		v.off, v.ln = uint32(j), uint32(ln)
		i = j + ln
	case kFixed:
		if len(b)-i < st.size {
			return i, errTruncated
		}
		v.off, v.ln = uint32(i), uint32(st.size)
		i += st.size
	default:
		// Compile only makes leaves of the kinds above.
		panic("definition: leaf of kind " + st.kind.String())
	}
	if e != errNone {
		return i, e
	}
	v.set = true
	return i, errNone
}

// skip steps over one value of n, checking what goavro would check.
func skip(b []byte, i int, n *node, depth int) (int, walkErr) {
	if depth > maxDepth {
		return i, errTooDeep
	}
	var e walkErr
	switch n.kind {
	case kNull:
	case kBoolean:
		if i >= len(b) {
			return i, errTruncated
		}
		if b[i] > 1 {
			return i, errBadBoolean
		}
		i++
	case kInt:
		_, i, e = readInt(b, i)
	case kLong:
		_, i, e = readLong(b, i)
	case kFloat:
		if len(b)-i < 4 {
			return i, errTruncated
		}
		i += 4
	case kDouble:
		if len(b)-i < 8 {
			return i, errTruncated
		}
		i += 8
	case kBytes, kString:
		var ln int
		if ln, i, e = readLen(b, i); e == errNone {
			i += ln
		}
	case kFixed:
		if len(b)-i < n.size {
			return i, errTruncated
		}
		i += n.size
	case kEnum:
		var idx int64
		if idx, i, e = readLong(b, i); e == errNone && (idx < 0 || idx >= int64(len(n.symbols))) {
			return i, errBadEnumIndex
		}
	case kRecord:
		for k := range n.fields {
			if i, e = skip(b, i, n.fields[k].typ, depth+1); e != errNone {
				return i, e
			}
		}
	case kUnion:
		var idx int64
		if idx, i, e = readLong(b, i); e != errNone {
			return i, e
		}
		if idx < 0 || idx >= int64(len(n.branches)) {
			return i, errBadUnionIndex
		}
		return skip(b, i, n.branches[idx], depth+1)
	case kArray, kMap:
		return skipBlocks(b, i, n, depth)
	}
	return i, e
}

// mapKeys remembers the keys of one map being skipped, because goavro refuses
// a map with a duplicate key (within or across blocks) and the walker accepts
// what goavro accepts. The first smallKeys keys are compared in place, without
// allocating; a larger map moves to a Go map.
type mapKeys struct {
	small [smallKeys][2]uint32 // offset, length
	n     int
	big   map[string]struct{}
}

const smallKeys = 16

// add records b[off:off+ln] and reports whether it was new.
func (k *mapKeys) add(b []byte, off, ln int) bool {
	key := b[off : off+ln]
	if k.big != nil {
		if _, dup := k.big[string(key)]; dup {
			return false
		}
		k.big[string(key)] = struct{}{}
		return true
	}
	for _, s := range k.small[:k.n] {
		if string(b[s[0]:s[0]+s[1]]) == string(key) {
			return false
		}
	}
	if k.n < smallKeys {
		k.small[k.n] = [2]uint32{uint32(off), uint32(ln)}
		k.n++
		return true
	}
	k.big = make(map[string]struct{}, 2*smallKeys)
	for _, s := range k.small[:k.n] {
		k.big[string(b[s[0]:s[0]+s[1]])] = struct{}{}
	}
	k.big[string(key)] = struct{}{}
	return true
}

func skipBlocks(b []byte, i int, n *node, depth int) (int, walkErr) {
	if n.kind == kMap {
		var keys mapKeys
		return skipItems(b, i, n, depth, &keys)
	}
	return skipItems(b, i, n, depth, nil)
}

// skipItems skips the blocks of an array, or of a map with keys (non-nil).
func skipItems(b []byte, i int, n *node, depth int, keys *mapKeys) (int, walkErr) {
	limit := maxBlockCount()
	for {
		count, j, e := readLong(b, i)
		if e != errNone {
			return j, e
		}
		i = j
		if count == 0 {
			return i, errNone
		}
		if count < 0 {
			if count == math.MinInt64 {
				return i, errBlockCount
			}
			count = -count
			// The block's byte size follows; items are walked anyway, so
			// that what is skipped is checked as goavro checks it.
			if _, i, e = readLong(b, i); e != errNone {
				return i, e
			}
		}
		if count > limit {
			return i, errBlockCount
		}
		for c := int64(0); c < count; c++ {
			if n.kind == kMap {
				var ln int
				if ln, i, e = readLen(b, i); e != errNone {
					return i, e
				}
				if !keys.add(b, i, ln) {
					return i, errDuplicateKey
				}
				i += ln
			}
			start := i
			if i, e = skip(b, i, n.items, depth+1); e != errNone {
				return i, e
			}
			if i == start && n.kind == kArray {
				// Items that take no bytes (null, an empty record): the
				// rest of the block is the same nothing.
				break
			}
		}
	}
}
