package codec

import (
	"strconv"
	"unsafe"
)

// fastDecoder decodes values written with exactly our Transaction schema,
// field by field, without reflection or intermediate maps.
type fastDecoder struct {
	limits Limits
}

func (d *fastDecoder) Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection {
	return d.decode(value, maxSeen, hasMaxSeen, tx, false)
}

var _ BorrowingDecoder = (*fastDecoder)(nil)

// DecodeBorrowed implements BorrowingDecoder.
func (d *fastDecoder) DecodeBorrowed(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction) *Rejection {
	return d.decode(value, maxSeen, hasMaxSeen, tx, true)
}

func (d *fastDecoder) decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *Transaction, borrow bool) *Rejection {
	if len(value) > d.limits.MaxRecordBytes {
		return tooLarge(len(value), d.limits.MaxRecordBytes)
	}
	if r := decodeTransaction(value, tx, borrow); r != nil {
		return r
	}
	return validate(tx, &d.limits, maxSeen, hasMaxSeen)
}

func tooLarge(n, limit int) *Rejection {
	return &Rejection{ReasonTooLarge, "record is " + strconv.Itoa(n) + " bytes, over the limit of " + strconv.Itoa(limit)}
}

// decodeTransaction decodes b in our schema's field order. It does not
// validate beyond what the wire format requires. With borrow, the ids are b's
// own bytes (see BorrowingDecoder) instead of a copy.
func decodeTransaction(b []byte, tx *Transaction, borrow bool) *Rejection {
	eventID, i, err := readBytes(b, 0)
	if err != errNone {
		return err.rejection("event_id", i)
	}
	idsFrom := i - len(eventID)
	entityID, i, err := readBytes(b, i)
	if err != errNone {
		return err.rejection("entity_id", i)
	}
	idsTo := i
	amount, i, err := readLong(b, i)
	if err != errNone {
		return err.rejection("amount_minor", i)
	}
	currency, i, err := readBytes(b, i)
	if err != errNone {
		return err.rejection("currency", i)
	}
	eventTime, i, err := readLong(b, i)
	if err != errNone {
		return err.rejection("event_time", i)
	}
	if i != len(b) {
		return &Rejection{ReasonDecode, strconv.Itoa(len(b)-i) + " trailing bytes after the record"}
	}
	// The two ids are adjacent in the record (only entity_id's length lies between
	// them), so one string holds both: one allocation per record instead of two.
	// They are kept and released together (the reorder buffer, the output), so
	// neither keeps the other alive for longer than it would itself live.
	var ids string
	if borrow {
		ids = unsafe.String(unsafe.SliceData(b[idsFrom:]), idsTo-idsFrom) // idsTo < len(b): fields follow
	} else {
		ids = string(b[idsFrom:idsTo])
	}
	tx.EventID = ids[:len(eventID)]
	tx.EntityID = ids[len(ids)-len(entityID):]
	tx.AmountMinor = amount
	tx.Currency = internCurrency(currency)
	tx.EventTime = eventTime
	return nil
}

// EncodeTransaction encodes tx in our Transaction schema, for generators and
// tests. It encodes whatever tx holds, valid or not, so that tests can build
// bad records with it.
func EncodeTransaction(tx *Transaction) []byte {
	return AppendTransaction(make([]byte, 0, 24+len(tx.EventID)+len(tx.EntityID)+len(tx.Currency)), tx)
}

// AppendTransaction appends tx in our Transaction schema to dst.
func AppendTransaction(dst []byte, tx *Transaction) []byte {
	dst = AppendString(dst, tx.EventID)
	dst = AppendString(dst, tx.EntityID)
	dst = AppendLong(dst, tx.AmountMinor)
	dst = AppendString(dst, tx.Currency)
	return AppendLong(dst, tx.EventTime)
}
