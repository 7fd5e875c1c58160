package replay

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// TestJSONFastAgreesWithGeneral builds lines from fragments, valid and not,
// and checks that whenever the fast path accepts a line, the general parser
// reads exactly the same transaction from it; and that the fast path does
// accept the common shape (or it would be dead code).
func TestJSONFastAgreesWithGeneral(t *testing.T) {
	values := map[string][]string{
		"event_id":     {`"e1"`, `"é-日"`, `"a\"b"`, `"a\u0041"`, `null`, `7`, `""`, `"` + "\xff" + `"`, `"x` + "\t" + `y"`, `"a\ud800"`},
		"entity_id":    {`"card-1"`, `null`, `""`, `true`, `"c\\d"`},
		"currency":     {`"EUR"`, `null`, `""`, `"eur"`, `5`},
		"amount_minor": {`5`, `0`, `-3`, `5.0`, `5e2`, `05`, `"5"`, `null`, `123456789012345678`, `1234567890123456789`, `99999999999999999999`, `-0`},
		"event_time":   {`1793491200000`, `1.7e12`, `"1793491200000"`, `null`, `-1`},
		"mcc":          {`"5411"`, `{"a":1}`, `[1]`, `1.5`, `true`, `false`, `null`},
		"EVENT_ID":     {`"other"`},
		"Amount_Minor": {`42`},
	}
	keys := []string{"event_id", "entity_id", "currency", "amount_minor", "event_time", "mcc", "EVENT_ID", "Amount_Minor"}
	rng := rand.New(rand.NewPCG(3, 4))
	fastAccepted := 0
	for range 30000 {
		var b strings.Builder
		b.WriteString([]string{"{", " {", "{\n"}[rng.IntN(3)])
		n := 0
		for _, k := range keys {
			// Required fields are usually present, the odd ones rarely.
			if p := map[bool]int{true: 12, false: 3}[k == strings.ToLower(k) && k != "mcc"]; rng.IntN(15) >= p {
				continue
			}
			if n > 0 {
				b.WriteString([]string{",", " , ", ",\t"}[rng.IntN(3)])
			}
			vs := values[k]
			v := vs[0]
			if rng.IntN(3) == 0 {
				v = vs[rng.IntN(len(vs))]
			}
			b.WriteString(`"` + k + `":` + []string{"", " "}[rng.IntN(2)] + v)
			n++
		}
		b.WriteString([]string{"}", "} ", "}x", ""}[min(rng.IntN(12), 3)])
		line := []byte(b.String())

		var fast, general codec.Transaction
		if !parseJSONFast(line, &fast) {
			continue
		}
		fastAccepted++
		if rej := parseJSONGeneral(line, &general); rej != nil {
			t.Fatalf("fast path accepted %s, the general parser refuses it: %v", line, rej)
		}
		if !reflect.DeepEqual(fast, general) {
			t.Fatalf("%s:\nfast    %+v\ngeneral %+v", line, fast, general)
		}
	}
	if fastAccepted < 300 {
		t.Fatalf("fast path accepted only %d lines", fastAccepted)
	}
}

func TestUnquoteJSON(t *testing.T) {
	tests := []struct {
		name, raw string
		want      string
		ok        bool
	}{
		{"plain", `"card-1"`, "card-1", true},
		{"empty", `""`, "", true},
		{"escapes", `"a\"b\\c\/d\b\f\n\r\t"`, "a\"b\\c/d\b\f\n\r\t", true},
		{"BMP escape", `"\u00e9\u65e5"`, "é日", true},
		{"surrogate pair", `"\ud83d\ude00"`, "😀", true},
		{"raw multi-byte", `"é😀"`, "é😀", true},
		// What encoding/json would turn into U+FFFD stays distinguishable.
		{"invalid byte kept", "\"b\xff\"", "b\xff", true},
		{"another invalid byte", "\"b\xfe\"", "b\xfe", true},
		{"lone high surrogate", `"a\ud800"`, "a\xed\xa0\x80", true},
		{"lone low surrogate", `"\udc00z"`, "\xed\xb0\x80z", true},
		{"high then a non-surrogate escape", `"\ud800\u0041"`, "\xed\xa0\x80A", true},
		{"two high surrogates", `"\ud800\ud800"`, "\xed\xa0\x80\xed\xa0\x80", true},
		{"not a string", `7`, "", false},
		{"unknown escape", `"\x41"`, "", false},
		{"short unicode escape", `"\u12"`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := unquoteJSON([]byte(tt.raw))
			if ok != tt.ok || got != tt.want {
				t.Fatalf("unquoteJSON(%q) = %q, %v; want %q, %v", tt.raw, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// FuzzUnquoteJSON: every string token encoding/json accepts is unquoted, and
// wherever the result is valid UTF-8 (nothing encoding/json would replace) it
// is exactly encoding/json's reading.
func FuzzUnquoteJSON(f *testing.F) {
	for _, s := range []string{`"a"`, `"\u00e9"`, `"\ud83d\ude00"`, `"\ud800"`, "\"\xff\"", `"\\\"\/"`, `"\ud800\udc00\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		// A token as a decoded object's json.RawMessage holds it: no
		// surrounding white space.
		if len(raw) == 0 || raw[0] != '"' || raw[len(raw)-1] != '"' || json.Unmarshal(raw, &want) != nil {
			return
		}
		got, ok := unquoteJSON(raw)
		if !ok {
			t.Fatalf("unquoteJSON(%q) refused a string encoding/json reads as %q", raw, want)
		}
		if utf8.ValidString(got) && got != want {
			t.Fatalf("unquoteJSON(%q) = %q, encoding/json %q", raw, got, want)
		}
		if !utf8.ValidString(got) && utf8.ValidString(want) && !strings.ContainsRune(want, utf8.RuneError) {
			t.Fatalf("unquoteJSON(%q) = %q is not UTF-8, yet encoding/json replaced nothing (%q)", raw, got, want)
		}
	})
}

// FuzzParseJSONTransaction: any line is read without panicking, as a
// transaction or a decode rejection; the fast path never reads a line
// differently from the general parser; and a transaction read from a line
// has the line's own bytes in its strings (nothing replaced by U+FFFD that
// the line does not hold).
func FuzzParseJSONTransaction(f *testing.F) {
	for _, s := range []string{
		`{"event_id":"e1","entity_id":"card-A","amount_minor":1000,"currency":"EUR","event_time":1793491200000}`,
		`{"event_id":"e\u00e9","entity_id":"c\"1","amount_minor":0,"event_time":-1,"extra":{"a":[1,2]}}`,
		"{\"event_id\":\"b\xff\",\"entity_id\":\"k\",\"amount_minor\":1,\"event_time\":1}",
		`{"event_id":"a\ud800","entity_id":null,"amount_minor":1,"event_time":1}`,
		`{"EVENT_ID":"x","event_id":"a","entity_id":"k","amount_minor":5.5,"event_time":1}`,
		`null`, `[]`, `{}`, `{"event_id":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		var general codec.Transaction
		rej := parseJSONGeneral(line, &general)
		if rej != nil && rej.Reason != codec.ReasonDecode {
			t.Fatalf("rejection %q, want decode", rej.Reason)
		}
		var fast codec.Transaction
		if parseJSONFast(line, &fast) {
			if rej != nil {
				t.Fatalf("fast path accepted %q, the general parser refuses it: %v", line, rej)
			}
			if !reflect.DeepEqual(fast, general) {
				t.Fatalf("%q:\nfast    %+v\ngeneral %+v", line, fast, general)
			}
		}
		if rej == nil {
			for _, s := range []string{general.EventID, general.EntityID, general.Currency} {
				if strings.Contains(s, "\uFFFD") && !bytes.Contains(line, []byte("\uFFFD")) && !bytes.Contains(bytes.ToLower(line), []byte(`\ufffd`)) {
					t.Fatalf("%q: read %q, a U+FFFD the line does not hold", line, s)
				}
			}
		}
	})
}
