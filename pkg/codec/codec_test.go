package codec

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

const t0 = 1_793_491_200_000 // 2026-11-01T00:00:00Z, T of docs/contract.md's worked example

func goodTx() Transaction {
	return Transaction{EventID: "e1", EntityID: "card-A", AmountMinor: 1000, Currency: "EUR", EventTime: t0}
}

// decoders returns every implementation of our schema, so each behavioural
// test runs against both the fast path and the goavro reference.
func decoders(t testing.TB, l Limits) map[string]Decoder {
	t.Helper()
	fast, err := NewDecoder("", l)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := fast.(*fastDecoder); !ok {
		t.Fatalf("NewDecoder(\"\") = %T, want the fast path", fast)
	}
	slow, err := newGoavroDecoder(schemas.Transaction, l.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	return map[string]Decoder{"fast": fast, "goavro": slow}
}

func TestValidation(t *testing.T) {
	tests := []struct {
		name       string
		edit       func(*Transaction)
		maxSeen    int64
		hasMaxSeen bool
		want       Reason // "" = accepted
	}{
		{"valid record is accepted", func(*Transaction) {}, 0, false, ""},
		{"empty event_id", func(tx *Transaction) { tx.EventID = "" }, 0, false, ReasonInvalidEventID},
		{"event_id of 128 bytes is accepted", func(tx *Transaction) { tx.EventID = strings.Repeat("x", 128) }, 0, false, ""},
		{"event_id of 129 bytes", func(tx *Transaction) { tx.EventID = strings.Repeat("x", 129) }, 0, false, ReasonInvalidEventID},
		{"event_id limit counts bytes not runes", func(tx *Transaction) { tx.EventID = strings.Repeat("é", 65) }, 0, false, ReasonInvalidEventID},
		{"event_id not UTF-8", func(tx *Transaction) { tx.EventID = "e\xff1" }, 0, false, ReasonInvalidEventID},
		{"empty entity_id", func(tx *Transaction) { tx.EntityID = "" }, 0, false, ReasonInvalidEntityID},
		{"entity_id of 256 bytes is accepted", func(tx *Transaction) { tx.EntityID = strings.Repeat("x", 256) }, 0, false, ""},
		{"entity_id of 257 bytes", func(tx *Transaction) { tx.EntityID = strings.Repeat("x", 257) }, 0, false, ReasonInvalidEntityID},
		{"entity_id not UTF-8", func(tx *Transaction) { tx.EntityID = "\xc3\x28" }, 0, false, ReasonInvalidEntityID},
		{"negative amount", func(tx *Transaction) { tx.AmountMinor = -1 }, 0, false, ReasonInvalidAmountMinor},
		{"zero amount is accepted", func(tx *Transaction) { tx.AmountMinor = 0 }, 0, false, ""},
		{"amount of 10^15 is accepted", func(tx *Transaction) { tx.AmountMinor = 1e15 }, 0, false, ""},
		{"amount over 10^15", func(tx *Transaction) { tx.AmountMinor = 1e15 + 1 }, 0, false, ReasonInvalidAmountMinor},
		{"amount MinInt64", func(tx *Transaction) { tx.AmountMinor = math.MinInt64 }, 0, false, ReasonInvalidAmountMinor},
		{"empty currency is accepted", func(tx *Transaction) { tx.Currency = "" }, 0, false, ""},
		{"lowercase currency", func(tx *Transaction) { tx.Currency = "eur" }, 0, false, ReasonInvalidCurrency},
		{"two-letter currency", func(tx *Transaction) { tx.Currency = "EU" }, 0, false, ReasonInvalidCurrency},
		{"four-letter currency", func(tx *Transaction) { tx.Currency = "EURO" }, 0, false, ReasonInvalidCurrency},
		{"non-ASCII currency", func(tx *Transaction) { tx.Currency = "ÄB" }, 0, false, ReasonInvalidCurrency},
		{"digits in currency", func(tx *Transaction) { tx.Currency = "E1R" }, 0, false, ReasonInvalidCurrency},
		{"event_time before 2000", func(tx *Transaction) { tx.EventTime = defaultMinEventTime - 1 }, 0, false, ReasonInvalidEventTime},
		{"event_time at 2000-01-01 is accepted", func(tx *Transaction) { tx.EventTime = defaultMinEventTime }, 0, false, ""},
		{"negative event_time", func(tx *Transaction) { tx.EventTime = -5 }, 0, false, ReasonInvalidEventTime},
		{"exactly 24h ahead of max seen is accepted", func(tx *Transaction) { tx.EventTime = t0 + defaultMaxAheadMs }, t0, true, ""},
		{"more than 24h ahead of max seen", func(tx *Transaction) { tx.EventTime = t0 + defaultMaxAheadMs + 1 }, t0, true, ReasonInvalidEventTime},
		{"far future without max seen is accepted", func(tx *Transaction) { tx.EventTime = math.MaxInt64 }, 0, false, ""},
		{"max seen near MaxInt64 does not overflow", func(tx *Transaction) { tx.EventTime = math.MaxInt64 }, math.MaxInt64 - 10, true, ""},
		{"far behind max seen is not this package's business", func(tx *Transaction) { tx.EventTime = t0 - 1e9 }, t0, true, ""},
		{"first broken rule wins: event_id before amount", func(tx *Transaction) { tx.EventID = ""; tx.AmountMinor = -1 }, 0, false, ReasonInvalidEventID},
		{"first broken rule wins: currency before event_time", func(tx *Transaction) { tx.Currency = "x"; tx.EventTime = 0 }, 0, false, ReasonInvalidCurrency},
	}
	for name, dec := range decoders(t, DefaultLimits()) {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				in := goodTx()
				tt.edit(&in)
				var got Transaction
				r := dec.Decode(EncodeTransaction(&in), tt.maxSeen, tt.hasMaxSeen, &got)
				if tt.want == "" {
					if r != nil {
						t.Fatalf("rejected: %v", r)
					}
					if !reflect.DeepEqual(got, in) {
						t.Fatalf("decoded %+v, want %+v", got, in)
					}
					return
				}
				if r == nil {
					t.Fatalf("accepted %+v, want %s", got, tt.want)
				}
				if r.Reason != tt.want {
					t.Fatalf("reason %q (%v), want %q", r.Reason, r, tt.want)
				}
				if r.Detail == "" || !strings.HasPrefix(r.Error(), string(tt.want)+": ") {
					t.Fatalf("error %q does not read \"<reason>: <detail>\"", r.Error())
				}
			})
		}
	}
}

func TestTooLargeIsCheckedBeforeDecoding(t *testing.T) {
	tx := goodTx()
	value := EncodeTransaction(&tx)
	for name, dec := range decoders(t, Limits{MaxRecordBytes: len(value)}) {
		t.Run(name, func(t *testing.T) {
			var got Transaction
			if r := dec.Decode(value, 0, false, &got); r != nil {
				t.Fatalf("record of exactly the limit rejected: %v", r)
			}
			// One garbage byte over the limit: undecodable too, but size comes first.
			if r := dec.Decode(append(value, 0xff), 0, false, &got); r == nil || r.Reason != ReasonTooLarge {
				t.Fatalf("got %v, want too_large", r)
			}
		})
	}
}

func TestDefaultLimits(t *testing.T) {
	l := DefaultLimits()
	if l != (Limits{}).WithDefaults() {
		t.Fatalf("zero Limits do not take the defaults: %+v", (Limits{}).WithDefaults())
	}
	if l.MaxRecordBytes != 1<<20 || l.MinEventTime != 946684800000 || l.MaxAheadMs != 86400000 {
		t.Fatalf("DefaultLimits() = %+v", l)
	}
	if got := Invalid("amount_minor"); got != ReasonInvalidAmountMinor {
		t.Fatalf("Invalid(amount_minor) = %q", got)
	}
}

// varint appends v as an Avro long, for building hand-made bad records.
func varint(v int64) []byte { return AppendLong(nil, v) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func TestDecodeErrors(t *testing.T) {
	tx := goodTx()
	good := EncodeTransaction(&tx)
	tests := []struct {
		name  string
		value []byte
		fast  string // substring of the fast decoder's detail
	}{
		{"empty value", nil, "event_id: truncated"},
		{"truncated inside event_id", good[:2], "event_id: length prefix beyond"},
		{"truncated before event_time", good[:len(good)-1-len(varint(t0))+1], "event_time: truncated"},
		{"truncated last byte", good[:len(good)-1], "event_time: truncated"},
		{"trailing byte", append(append([]byte{}, good...), 0), "1 trailing bytes"},
		{"negative length prefix", cat(varint(-3), []byte("abc")), "event_id: negative length"},
		{"huge length prefix", cat(varint(math.MaxInt64), []byte("abc")), "event_id: length prefix beyond"},
		{"length prefix just past the end", cat(varint(4), []byte("abc")), "event_id: length prefix beyond"},
		{"varint of 11 bytes", cat(varint(2), []byte("e1"), varint(1), []byte("A"), bytes.Repeat([]byte{0x80}, 10), []byte{0}), "amount_minor: varint longer"},
		{"varint overflowing 64 bits", cat(varint(2), []byte("e1"), varint(1), []byte("A"), bytes.Repeat([]byte{0xff}, 9), []byte{0x02}), "amount_minor: varint longer"},
	}
	for name, dec := range decoders(t, DefaultLimits()) {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				var got Transaction
				r := dec.Decode(tt.value, 0, false, &got)
				if name == "goavro" && strings.Contains(tt.name, "varint") {
					// goavro silently drops the bits past 64 (see binary.go);
					// it must still not accept the record as valid here.
					if r == nil {
						t.Fatalf("goavro accepted %x as %+v", tt.value, got)
					}
					return
				}
				if r == nil || r.Reason != ReasonDecode {
					t.Fatalf("got %v, want decode", r)
				}
				if name == "fast" && !strings.Contains(r.Detail, tt.fast) {
					t.Fatalf("detail %q does not mention %q", r.Detail, tt.fast)
				}
			})
		}
	}
}

func TestCurrencyIsInterned(t *testing.T) {
	for _, c := range []string{"AAA", "EUR", "USD", "ZZZ"} {
		if got := internCurrency([]byte(c)); got != c {
			t.Fatalf("internCurrency(%q) = %q", c, got)
		}
	}
	if got := internCurrency([]byte("eur")); got != "eur" {
		t.Fatalf("invalid code not kept for the report: %q", got)
	}
	tx := goodTx()
	value := EncodeTransaction(&tx)
	dec, _ := NewDecoder("", Limits{})
	var got Transaction
	// One string holding both ids is the only allocation a valid record may cost.
	if n := testing.AllocsPerRun(100, func() { dec.Decode(value, t0, true, &got) }); n > 1 {
		t.Fatalf("decode of a valid record allocates %v times, want <= 1", n)
	}
	if got.EventID != tx.EventID || got.EntityID != tx.EntityID {
		t.Fatalf("ids %q, %q; want %q, %q", got.EventID, got.EntityID, tx.EventID, tx.EntityID)
	}
}
