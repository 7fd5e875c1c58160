package definition

import (
	"math"
	"math/big"
	"regexp"
	"strconv"
)

// decimalLiteral is the syntax of a numeric constant in a filter: a plain
// decimal with an optional exponent, as YAML and JSON write numbers. It is
// read exactly (big.Rat), never through a float.
var decimalLiteral = regexp.MustCompile(`^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,4})?$`)

func parseRat(text string) (*big.Rat, bool) {
	if !decimalLiteral.MatchString(text) {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(text)
	return r, ok
}

var (
	bigMinInt64 = big.NewInt(math.MinInt64)
	bigMaxInt64 = big.NewInt(math.MaxInt64)
)

func pow10(n int) *big.Int { return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(n)), nil) }

// intRange is a comparison against a constant, compiled for an integer value
// u (an int or long, or a decimal's unscaled value): the predicate holds iff
// u is in [lo, hi], inverted when negate. The bounds are exact: a constant
// that is not a whole number at the field's scale becomes the floor or ceiling
// that gives the same answer for every integer. The int64 bounds serve values
// that fit in int64 (every int and long, and nearly every decimal); the big
// ones the rare decimal wider than 64 bits.
type intRange struct {
	lo, hi     int64
	empty      bool // no int64 is in range
	bigLo      *big.Int
	bigHi      *big.Int // nil: unbounded on that side
	bigEmpty   bool
	negate     bool
	isNotEqual bool
}

// newIntRange compiles "u × 10^-scale op c".
func newIntRange(c *big.Rat, scale int, op Op) intRange {
	// C = c × 10^scale, the constant in units of the field's last digit.
	C := new(big.Rat).Mul(c, new(big.Rat).SetInt(pow10(scale)))
	floor := new(big.Int).Div(C.Num(), C.Denom()) // Euclidean division: floor for a positive denominator
	whole := C.IsInt()
	ceil := new(big.Int).Set(floor)
	if !whole {
		ceil.Add(ceil, big.NewInt(1))
	}
	var r intRange
	switch op {
	case OpEq, OpNe:
		if whole {
			r.bigLo, r.bigHi = floor, floor
		} else {
			r.bigEmpty = true
		}
		r.negate = op == OpNe
	case OpLt: // u < C ⇔ u ≤ ceil(C) − 1
		r.bigHi = new(big.Int).Sub(ceil, big.NewInt(1))
	case OpLe: // u ≤ C ⇔ u ≤ floor(C)
		r.bigHi = floor
	case OpGt: // u > C ⇔ u ≥ floor(C) + 1
		r.bigLo = new(big.Int).Add(floor, big.NewInt(1))
	case OpGe: // u ≥ C ⇔ u ≥ ceil(C)
		r.bigLo = ceil
	}
	r.lo, r.hi, r.empty = math.MinInt64, math.MaxInt64, r.bigEmpty
	if r.bigLo != nil {
		switch {
		case r.bigLo.Cmp(bigMaxInt64) > 0:
			r.empty = true
		case r.bigLo.Cmp(bigMinInt64) > 0:
			r.lo = r.bigLo.Int64()
		}
	}
	if r.bigHi != nil {
		switch {
		case r.bigHi.Cmp(bigMinInt64) < 0:
			r.empty = true
		case r.bigHi.Cmp(bigMaxInt64) < 0:
			r.hi = r.bigHi.Int64()
		}
	}
	return r
}

func (r *intRange) match(u int64) bool {
	in := !r.empty && r.lo <= u && u <= r.hi
	return in != r.negate
}

func (r *intRange) matchBig(u *big.Int) bool {
	in := !r.bigEmpty && (r.bigLo == nil || u.Cmp(r.bigLo) >= 0) && (r.bigHi == nil || u.Cmp(r.bigHi) <= 0)
	return in != r.negate
}

// floatRange is a comparison of a float or double against a decimal
// constant, compiled exactly: the constant is replaced by the adjacent binary
// values that give the same answer for every finite or infinite float. NaN is
// in no range and, unlike IEEE ne, satisfies no predicate, ne included.
type floatRange struct {
	lo, hi float64
	empty  bool
	negate bool
}

func newFloatRange(c *big.Rat, op Op) floatRange {
	f, _ := c.Float64()
	cmp := 0 // sign of f − c
	if math.IsInf(f, 0) {
		cmp = int(math.Copysign(1, f))
	} else {
		cmp = new(big.Rat).SetFloat64(f).Cmp(c)
	}
	floorF, ceilF := f, f // largest float ≤ c, smallest float ≥ c
	if cmp > 0 {
		floorF = math.Nextafter(f, math.Inf(-1))
	}
	if cmp < 0 {
		ceilF = math.Nextafter(f, math.Inf(1))
	}
	r := floatRange{lo: math.Inf(-1), hi: math.Inf(1)}
	switch op {
	case OpEq, OpNe:
		if cmp == 0 {
			r.lo, r.hi = f, f
		} else {
			r.empty = true
		}
		r.negate = op == OpNe
	case OpLt: // x < c ⇔ x ≤ the largest float strictly below c
		r.hi = floorF
		if cmp == 0 {
			r.hi = math.Nextafter(f, math.Inf(-1))
		}
	case OpLe:
		r.hi = floorF
	case OpGt:
		r.lo = ceilF
		if cmp == 0 {
			r.lo = math.Nextafter(f, math.Inf(1))
		}
	case OpGe:
		r.lo = ceilF
	}
	return r
}

func (r *floatRange) match(x float64) bool {
	if x != x { // NaN
		return false
	}
	in := !r.empty && r.lo <= x && x <= r.hi
	return in != r.negate
}

// unscaled64 reads a decimal's big-endian two's-complement unscaled value. ok
// is false when it does not fit in an int64 (then the caller takes the big.Int
// path); sign-extension bytes do not count, so a fixed(16) holding a small
// value still fits.
func unscaled64(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, true
	}
	neg := b[0]&0x80 != 0
	// Drop leading bytes that only extend the sign.
	for len(b) > 1 && ((b[0] == 0 && b[1]&0x80 == 0) || (b[0] == 0xff && b[1]&0x80 != 0)) {
		b = b[1:]
	}
	if len(b) > 8 {
		return 0, false
	}
	var u uint64
	if neg {
		u = math.MaxUint64 // sign-extend
	}
	for _, c := range b {
		u = u<<8 | uint64(c)
	}
	return int64(u), true
}

// unscaledBig is the big.Int reading of the same bytes, for the rare decimal
// wider than 64 bits.
func unscaledBig(b []byte) *big.Int {
	v := new(big.Int).SetBytes(b)
	if len(b) > 0 && b[0]&0x80 != 0 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	return v
}

// pow10s[k] = 10^k for the k that fit in int64.
var pow10s = func() [19]int64 {
	var p [19]int64
	p[0] = 1
	for i := 1; i < len(p); i++ {
		p[i] = p[i-1] * 10
	}
	return p
}()

// amountProblem says why an amount did not convert; the reason is always
// invalid:<amount path>.
type amountProblem uint8

const (
	amountOK amountProblem = iota
	amountFraction
	amountRange
	amountNotFinite
)

func (a amountProblem) String() string {
	switch a {
	case amountFraction:
		return "has more fraction digits than amount_exponent allows"
	case amountRange:
		return "is outside the range of minor units (int64)"
	case amountNotFinite:
		return "is NaN or infinite"
	}
	return "ok"
}

// scaleMinor turns an unscaled decimal u × 10^-scale into minor units
// u × 10^(exp−scale), exactly or not at all.
func scaleMinor(u int64, scale, exp int) (int64, amountProblem) {
	k := exp - scale
	switch {
	case k == 0:
		return u, amountOK
	case k > 0:
		if k >= len(pow10s) {
			if u == 0 {
				return 0, amountOK
			}
			return 0, amountRange
		}
		p := pow10s[k]
		if u > math.MaxInt64/p || u < math.MinInt64/p {
			return 0, amountRange
		}
		return u * p, amountOK
	default:
		k = -k
		if k >= len(pow10s) {
			// |u| < 10^19 ≤ 10^k: only zero divides.
			if u == 0 {
				return 0, amountOK
			}
			return 0, amountFraction
		}
		p := pow10s[k]
		if u%p != 0 {
			return 0, amountFraction
		}
		return u / p, amountOK
	}
}

// scaleMinorBig is scaleMinor for an unscaled value wider than 64 bits.
func scaleMinorBig(u *big.Int, scale, exp int) (int64, amountProblem) {
	k := exp - scale
	v := new(big.Int).Set(u)
	if k > 0 {
		v.Mul(v, pow10(k))
	} else if k < 0 {
		var m big.Int
		v.QuoRem(v, pow10(-k), &m)
		if m.Sign() != 0 {
			return 0, amountFraction
		}
	}
	if !v.IsInt64() {
		return 0, amountRange
	}
	return v.Int64(), amountOK
}

// roundFloat turns a float or double amount into minor units by the stated
// rule: take the shortest decimal that reads back as the same binary value
// (what a printout or JSON shows, strconv 'e' with precision -1), shift it by
// exp digits, and round the result to a whole number with mode. bits is 32
// for a float, so that 0.1f is 0.1 and not 0.100000001490116.
func roundFloat(x float64, bits int, exp int, mode Rounding) (int64, amountProblem) {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, amountNotFinite
	}
	var buf [32]byte
	s := strconv.AppendFloat(buf[:0], x, 'e', -1, bits)
	// s is [-]d[.ddd]e±XX
	neg := false
	if s[0] == '-' {
		neg, s = true, s[1:]
	}
	var digits int64
	nd := 0
	i := 0
	for ; i < len(s) && s[i] != 'e'; i++ {
		if s[i] == '.' {
			continue
		}
		digits = digits*10 + int64(s[i]-'0') // at most 17 digits: fits
		nd++
	}
	e, eneg := 0, false
	for _, c := range s[i+1:] {
		switch {
		case c == '-':
			eneg = true
		case '0' <= c && c <= '9':
			e = e*10 + int(c-'0')
		}
	}
	if eneg {
		e = -e
	}
	// value = digits × 10^(e − (nd−1)); minor = value × 10^exp
	k := e - (nd - 1) + exp
	var m int64
	switch {
	case k >= 0:
		if k >= len(pow10s) {
			if digits == 0 {
				return 0, amountOK
			}
			return 0, amountRange
		}
		p := pow10s[k]
		if digits > math.MaxInt64/p {
			return 0, amountRange
		}
		m = digits * p
	default:
		k = -k
		if k >= len(pow10s) {
			// digits < 10^17, so 2×digits < 10^k: below one half.
			m = 0
			break
		}
		p := pow10s[k]
		q, r := digits/p, digits%p
		switch {
		case 2*r > p, 2*r == p && (mode == RoundHalfAwayFromZero || q%2 == 1):
			q++
		}
		m = q
	}
	if neg {
		m = -m
	}
	return m, amountOK
}
