package codec

import "strconv"

// Avro binary primitives for the hand-written codec: zig-zag varints and
// length-prefixed bytes. They are strict where goavro is lax: a varint longer
// than 10 bytes or overflowing 64 bits is an error instead of silently
// dropping high bits, because a record that only decodes by losing bits is
// corrupt.

// decodeErr says why a value failed to decode. Small values, no allocation,
// until it becomes a Rejection.
type decodeErr uint8

const (
	errNone decodeErr = iota
	errTruncated
	errVarintOverflow
	errNegativeLength
	errLengthBeyondRecord
	errBadBoolean
	errBadUnionIndex
	errIntOverflow
)

func (e decodeErr) String() string {
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
	case errIntOverflow:
		return "int value overflows 32 bits"
	}
	return "ok"
}

func (e decodeErr) rejection(field string, at int) *Rejection {
	return &Rejection{ReasonDecode, field + ": " + e.String() + " at byte " + strconv.Itoa(at)}
}

// readLong reads a zig-zag varint at b[i:], returning the value and the next index.
func readLong(b []byte, i int) (int64, int, decodeErr) {
	// One-byte values (|v| < 64: lengths of short strings, small counts) are
	// the common case; take them without the loop.
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

// readBytes reads a length-prefixed byte string at b[i:]; the result aliases b.
func readBytes(b []byte, i int) ([]byte, int, decodeErr) {
	n, j, err := readLong(b, i)
	if err != errNone {
		return nil, j, err
	}
	if n < 0 {
		return nil, i, errNegativeLength
	}
	// Compare against what is left before slicing, so that a huge prefix never
	// allocates or overflows.
	if n > int64(len(b)-j) {
		return nil, i, errLengthBeyondRecord
	}
	return b[j : j+int(n)], j + int(n), errNone
}

// AppendLong appends v as an Avro long (zig-zag varint).
func AppendLong(dst []byte, v int64) []byte {
	u := uint64(v<<1) ^ uint64(v>>63)
	for u >= 0x80 {
		dst = append(dst, byte(u)|0x80)
		u >>= 7
	}
	return append(dst, byte(u))
}

// AppendString appends s as an Avro string (its length, then its bytes).
func AppendString(dst []byte, s string) []byte {
	dst = AppendLong(dst, int64(len(s)))
	return append(dst, s...)
}

// currencyCodes holds every three-uppercase-letter string back to back, so a
// valid currency becomes a substring of it instead of a new allocation: the
// hot path may allocate only the two id strings.
var currencyCodes = func() string {
	b := make([]byte, 0, 26*26*26*3)
	for x := byte('A'); x <= 'Z'; x++ {
		for y := byte('A'); y <= 'Z'; y++ {
			for z := byte('A'); z <= 'Z'; z++ {
				b = append(b, x, y, z)
			}
		}
	}
	return string(b)
}()

// internCurrency returns c as a string without allocating when it is empty or
// a valid code; anything else is copied so that validation can report it.
func internCurrency(c []byte) string {
	if len(c) == 0 {
		return ""
	}
	if len(c) == 3 && isUpper(c[0]) && isUpper(c[1]) && isUpper(c[2]) {
		i := ((int(c[0]-'A')*26+int(c[1]-'A'))*26 + int(c[2]-'A')) * 3
		return currencyCodes[i : i+3]
	}
	return string(c)
}
