// Package codec turns record values into validated Transactions and
// VelocityFeatures into record values, in plain Avro binary per the schemas in
// package schemas.
//
// It is for the per-record hot path: a Decoder sizes, decodes and validates one
// value and names the reason when it refuses it (a dead letter's
// velocity.reason), and AppendFeatures encodes one output value without
// allocating. Records written with our own schema go through a hand-written
// Avro decoder; records written with another writer schema, and Avro object
// container files (ContainerReader, ContainerWriter), go through goavro and
// are resolved against ours. The hand-written codec is trusted because the
// tests hold it byte for byte to goavro on random and fuzzed records.
//
// It is not for Kafka, the Confluent wire-format prefix, the schema registry,
// or the semantics of windows, dedupe and lateness: callers strip the prefix,
// pick the writer schema, and decide what a valid transaction means for state.
package codec

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// Transaction is one decoded and validated input record (schemas.Transaction).
type Transaction struct {
	EventID     string
	EntityID    string
	AmountMinor int64
	Currency    string // "" or three uppercase ASCII letters
	EventTime   int64  // Unix milliseconds UTC

	// Ext carries what a feature definition's filters and distinct counts need from
	// the record, decided once at decode; nil without a definition (pkg/definition):
	//
	//	Ext[0]   bit i (0..31) = filter i matched this record;
	//	         bit 32+j      = distinct slot j has a value in this record
	//	Ext[1+j] = the 64-bit hash of distinct slot j's value (0 when absent)
	//
	// A decoder reuses its backing array (tx.Ext = append(tx.Ext[:0], ...)), so the
	// reorder buffer and snapshots carry these words, never the record.
	Ext []uint64

	// Groups carries, under a definition with re-keyed groups (docs/repartition.md),
	// one entry per group after the first, in the definition's order: that group's
	// key and its Ext words, laid out for the group's own features as Ext is for the
	// first group's. nil without such groups. The decoder reuses the slice and the
	// entries' arrays, so they are valid until its next Decode.
	Groups []GroupValues
}

// GroupValues is what one re-keyed group needs from a record.
type GroupValues struct {
	// Key is the group's key; "" when the record has none for the group (a null,
	// absent or empty field): the record then counts for the other groups only.
	Key string
	// Ext are the group's filter bits and distinct-value hashes (layout of
	// Transaction.Ext).
	Ext []uint64
}

// Reason is the machine-readable cause of a dead letter, the value of the
// velocity.reason header.
type Reason string

// The reasons the contract names. Invalid builds the per-field ones.
const (
	ReasonDecode    Reason = "decode"
	ReasonLate      Reason = "late"
	ReasonDuplicate Reason = "duplicate"
	ReasonTooLarge  Reason = "too_large"
)

// Invalid is the reason for a record that decodes but breaks a rule on field.
func Invalid(field string) Reason { return Reason("invalid:" + field) }

// The reasons Decode produces for field rules, spelled once so that the hot
// path does not build strings.
const (
	ReasonInvalidEventID     Reason = "invalid:event_id"
	ReasonInvalidEntityID    Reason = "invalid:entity_id"
	ReasonInvalidAmountMinor Reason = "invalid:amount_minor"
	ReasonInvalidCurrency    Reason = "invalid:currency"
	ReasonInvalidEventTime   Reason = "invalid:event_time"
)

// Dead-letter header names. This is the only place they are spelled.
const (
	HeaderReason          = "velocity.reason"
	HeaderError           = "velocity.error"
	HeaderSourceTopic     = "velocity.source.topic"
	HeaderSourcePartition = "velocity.source.partition"
	HeaderSourceOffset    = "velocity.source.offset"
)

// Rejection is the typed result of a failed decode or validation: Reason goes
// to the velocity.reason header, Error() to velocity.error.
type Rejection struct {
	Reason Reason
	Detail string
}

func (r *Rejection) Error() string { return string(r.Reason) + ": " + r.Detail }

// Field limits from the data contract.
const (
	MaxEventIDBytes  = 128
	MaxEntityIDBytes = 256
	MaxAmountMinor   = 1_000_000_000_000_000 // 10^15 minor units
)

// Limits are the sanity bounds Decode applies beyond the field rules. The zero
// value of each field means its default, so Limits{} equals DefaultLimits().
type Limits struct {
	MaxRecordBytes int   // default 1 MiB; a larger value is too_large, checked before decoding
	MinEventTime   int64 // default 2000-01-01T00:00:00Z (946684800000)
	MaxAheadMs     int64 // default 24h ahead of the partition's max seen event time
}

const (
	defaultMaxRecordBytes = 1 << 20
	defaultMinEventTime   = 946_684_800_000 // 2000-01-01T00:00:00Z
	defaultMaxAheadMs     = 24 * 60 * 60 * 1000
)

// DefaultLimits returns the contract's defaults.
func DefaultLimits() Limits {
	return Limits{MaxRecordBytes: defaultMaxRecordBytes, MinEventTime: defaultMinEventTime, MaxAheadMs: defaultMaxAheadMs}
}

// WithDefaults returns l with each zero field at its default (DefaultLimits).
func (l Limits) WithDefaults() Limits {
	if l.MaxRecordBytes == 0 {
		l.MaxRecordBytes = defaultMaxRecordBytes
	}
	if l.MinEventTime == 0 {
		l.MinEventTime = defaultMinEventTime
	}
	if l.MaxAheadMs == 0 {
		l.MaxAheadMs = defaultMaxAheadMs
	}
	return l
}

// Decoder turns one record value into a validated Transaction.
type Decoder interface {
	// Decode fills tx from one record value (size check, decode, validate) and
	// returns nil, or a *Rejection naming the first rule the value breaks.
	// maxSeen is the partition's max accepted event time; it bounds how far
	// ahead event_time may be only when hasMaxSeen. tx is unspecified after a
	// rejection. value is not retained.
	Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection
}

// BorrowingDecoder is a Decoder that can also leave the decoded ids in value's
// bytes instead of copying them: tx.EventID and tx.EntityID are then valid only
// while value is neither written nor freed, and a caller that keeps either must
// copy it. A caller that counts most events within the call saves the copy (the
// only allocation of a decode).
type BorrowingDecoder interface {
	Decoder
	DecodeBorrowed(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection
}

// Validate applies the contract's field rules to a decoded tx (see validate),
// with limits' zero fields at their defaults. Reasons name the contract's fields
// (invalid:event_id, ...); a decoder over another schema renames them to its own.
func Validate(tx *Transaction, limits Limits, maxSeen int64, hasMaxSeen bool) *Rejection {
	l := limits.WithDefaults()
	return validate(tx, &l, maxSeen, hasMaxSeen)
}

// validate applies the contract's field rules in schema order; the first
// broken rule names the reason. Both decoders call it, so they cannot
// disagree on what is valid.
func validate(tx *Transaction, l *Limits, maxSeen int64, hasMaxSeen bool) *Rejection {
	if r := checkID(tx.EventID, MaxEventIDBytes, ReasonInvalidEventID, "event_id"); r != nil {
		return r
	}
	if r := checkID(tx.EntityID, MaxEntityIDBytes, ReasonInvalidEntityID, "entity_id"); r != nil {
		return r
	}
	if a := tx.AmountMinor; a < 0 || a > MaxAmountMinor {
		return &Rejection{ReasonInvalidAmountMinor, "amount_minor " + strconv.FormatInt(a, 10) + " is outside 0..10^15"}
	}
	if c := tx.Currency; c != "" && !isCurrencyCode(c) {
		return &Rejection{ReasonInvalidCurrency, "currency " + strconv.Quote(c) + " is neither empty nor three uppercase letters"}
	}
	t := tx.EventTime
	if t < l.MinEventTime {
		return &Rejection{ReasonInvalidEventTime, "event_time " + strconv.FormatInt(t, 10) + " is before the minimum " + strconv.FormatInt(l.MinEventTime, 10)}
	}
	// Written as a subtraction bound so that a max seen near MaxInt64 cannot overflow.
	if hasMaxSeen && maxSeen <= math.MaxInt64-l.MaxAheadMs && t > maxSeen+l.MaxAheadMs {
		return &Rejection{ReasonInvalidEventTime, "event_time " + strconv.FormatInt(t, 10) + " is more than " +
			strconv.FormatInt(l.MaxAheadMs, 10) + " ms ahead of the partition's max seen " + strconv.FormatInt(maxSeen, 10)}
	}
	return nil
}

func checkID(s string, limit int, reason Reason, field string) *Rejection {
	switch {
	case s == "":
		return &Rejection{reason, field + " is missing or empty"}
	case len(s) > limit:
		return &Rejection{reason, field + " is " + strconv.Itoa(len(s)) + " bytes, over the limit of " + strconv.Itoa(limit)}
	case !utf8.ValidString(s):
		return &Rejection{reason, field + " is not valid UTF-8"}
	}
	return nil
}

func isCurrencyCode(c string) bool {
	return len(c) == 3 && isUpper(c[0]) && isUpper(c[1]) && isUpper(c[2])
}

func isUpper(b byte) bool { return 'A' <= b && b <= 'Z' }
