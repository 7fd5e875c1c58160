package definition

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Distinct values are counted by a 64-bit hash of a canonical encoding that
// includes the value's type, so that the string "1" and the long 1 are
// different values while a schema change that keeps the meaning (int to long,
// string to enum) keeps the hashes. The hash reaches snapshots and decides
// which values adaptive sampling keeps, so it is part of the output contract:
// it must never change for the same value.
//
//	hash = XXH3-64 (seed 0) of  tag byte ‖ payload
//	  text    (string, enum symbol)    tag 's'  payload: the UTF-8 bytes
//	  bytes   (bytes, fixed)           tag 'b'  payload: the bytes
//	  integer (int, long)              tag 'i'  payload: 8 bytes, little-endian two's complement
//	  boolean                          tag 'z'  payload: one byte, 0 or 1
const (
	tagText  = 's'
	tagBytes = 'b'
	tagInt   = 'i'
	tagBool  = 'z'
)

// hashTagged hashes tag ‖ p. Values up to 255 bytes are assembled on the
// stack (in a buffer of 32 or 256 bytes); longer ones stream through a Hasher, which gives the same hash.
func hashTagged(tag byte, p []byte) uint64 {
	if len(p) < 32 { // ids and codes: a smaller buffer to zero
		var buf [32]byte
		buf[0] = tag
		n := copy(buf[1:], p)
		return xxh3.Hash(buf[:1+n])
	}
	if len(p) < 256 {
		var buf [256]byte
		buf[0] = tag
		n := copy(buf[1:], p)
		return xxh3.Hash(buf[:1+n])
	}
	var h xxh3.Hasher
	h.Reset()
	h.Write([]byte{tag})
	h.Write(p)
	return h.Sum64()
}

func hashInt64(v int64) uint64 {
	var buf [9]byte
	buf[0] = tagInt
	binary.LittleEndian.PutUint64(buf[1:], uint64(v))
	return xxh3.Hash(buf[:])
}

func hashBoolean(v bool) uint64 {
	buf := [2]byte{tagBool, 0}
	if v {
		buf[1] = 1
	}
	return xxh3.Hash(buf[:])
}
