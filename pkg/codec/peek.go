package codec

// PeekEventID returns the event_id bytes of an encoded Transaction without decoding
// it, for hints only (prefetching the dedupe slot a record will probe a few records
// before it is processed). It assumes the layout of schemas/transaction.avsc, where
// event_id comes first, with or without the Confluent wire-format prefix (a zero byte
// and a 4-byte schema id; a plain Avro value cannot start with a zero byte, which
// would be an empty event_id). A value in another layout gives wrong bytes or false,
// never a panic. The result aliases value.
func PeekEventID(value []byte) ([]byte, bool) {
	i := 0
	if len(value) > 5 && value[0] == 0 {
		i = 5
	}
	id, _, err := readBytes(value, i)
	if err != errNone || len(id) == 0 {
		return nil, false
	}
	return id, true
}
