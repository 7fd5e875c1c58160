package codec

import (
	"testing"
)

func TestPeekEventID(t *testing.T) {
	plain := EncodeTransaction(&Transaction{EventID: "evt-1", EntityID: "card-1", AmountMinor: 5, Currency: "EUR", EventTime: 1})
	framed := append([]byte{0, 0, 0, 0, 7}, plain...)
	for _, c := range []struct {
		name  string
		value []byte
		want  string
		ok    bool
	}{
		{"plain Avro", plain, "evt-1", true},
		{"Confluent wire format", framed, "evt-1", true},
		{"empty", nil, "", false},
		{"length beyond the end", []byte{0x7e, 'a'}, "", false},
		{"negative length", []byte{0x01}, "", false},
		{"truncated varint", []byte{0x80}, "", false},
		{"prefix only", []byte{0, 0, 0, 0, 7}, "", false},
	} {
		got, ok := PeekEventID(c.value)
		if ok != c.ok || string(got) != c.want {
			t.Errorf("%s: PeekEventID = %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

func FuzzPeekEventID(f *testing.F) {
	f.Add(EncodeTransaction(&Transaction{EventID: "e", EntityID: "c", EventTime: 1}))
	f.Add([]byte{0, 0, 0, 0, 1, 2, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		if id, ok := PeekEventID(b); ok && (len(id) == 0 || len(id) > len(b)) {
			t.Fatalf("PeekEventID(%x) = %x", b, id)
		}
	})
}
