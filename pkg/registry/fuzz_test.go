package registry

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// cachedDecoder is a Decoder whose ids 1 (our schema) and 2 (the evolved one)
// are already resolved and whose registry is unreachable with its context
// done, so that any other id is rejected at once: no network in fuzzing or
// benchmarks.
func cachedDecoder(tb testing.TB) *Decoder {
	tb.Helper()
	cl, err := sr.NewClient(sr.URLs("http://127.0.0.1:1"))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := NewDecoder(ctx, cl, codec.Limits{})
	m := map[int]*entry{}
	for id, s := range map[int]string{1: schemas.Transaction, 2: evolvedTransaction} {
		dec, err := codec.NewDecoder(s, d.limits)
		if err != nil {
			tb.Fatal(err)
		}
		m[id] = &entry{dec: dec}
	}
	d.ids.Store(&m)
	return d
}

// FuzzDecode: any value either decodes to a transaction that satisfies the
// field rules or is rejected with a reason; values without the magic byte
// are always decode rejections; nothing panics.
func FuzzDecode(f *testing.F) {
	tx := codec.Transaction{EventID: "e1", EntityID: "card", AmountMinor: 5, Currency: "EUR", EventTime: t0}
	f.Add(append(AppendHeader(nil, 1), codec.EncodeTransaction(&tx)...))
	f.Add(append(AppendHeader(nil, 2), codec.EncodeTransaction(&tx)...))
	f.Add(append(AppendHeader(nil, 3), codec.EncodeTransaction(&tx)...))
	f.Add(codec.EncodeTransaction(&tx))
	f.Add([]byte{0, 0, 0, 0})
	d := cachedDecoder(f)
	f.Fuzz(func(t *testing.T, v []byte) {
		var got codec.Transaction
		rej := d.Decode(v, 0, false, &got)
		if len(v) > 0 && v[0] != 0 && (rej == nil || rej.Reason != codec.ReasonDecode) {
			t.Fatalf("value without the magic byte: %v", rej)
		}
		if rej != nil {
			if rej.Reason == "" || rej.Detail == "" {
				t.Fatalf("rejection without reason or detail: %+v", rej)
			}
			return
		}
		if got.EventID == "" || got.EntityID == "" || got.AmountMinor < 0 || got.AmountMinor > codec.MaxAmountMinor {
			t.Fatalf("accepted an invalid transaction %+v", got)
		}
	})
}

// BenchmarkDecode compares the registry decoder (prefix check, lock-free id
// lookup, then the same codec decoder) with the plain decoder on the same record.
func BenchmarkDecode(b *testing.B) {
	tx := codec.Transaction{EventID: "evt-0123456789", EntityID: "card-0123456789", AmountMinor: 12345, Currency: "EUR", EventTime: t0}
	plain := codec.EncodeTransaction(&tx)
	fast, err := codec.NewDecoder("", codec.Limits{})
	if err != nil {
		b.Fatal(err)
	}
	d := cachedDecoder(b)
	for _, bc := range []struct {
		name  string
		dec   codec.Decoder
		value []byte
	}{
		{"plain", fast, plain},
		{"registry/our-schema", d, append(AppendHeader(nil, 1), plain...)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var out codec.Transaction
			for b.Loop() {
				if rej := bc.dec.Decode(bc.value, 0, false, &out); rej != nil {
					b.Fatal(rej)
				}
			}
		})
	}
}
