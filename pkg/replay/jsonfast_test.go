package replay

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// TestJSONFastAgreesWithEncodingJSON builds lines from fragments, valid and
// not, and checks that whenever the fast path accepts a line, encoding/json
// reads exactly the same transaction from it; and that the fast path does
// accept the common shape (or it would be dead code).
func TestJSONFastAgreesWithEncodingJSON(t *testing.T) {
	values := map[string][]string{
		"event_id":     {`"e1"`, `"é-日"`, `"a\"b"`, `"a\u0041"`, `null`, `7`, `""`, `"` + "\xff" + `"`, `"x` + "\t" + `y"`},
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
			t.Fatalf("fast path accepted %s, encoding/json refuses it: %v", line, rej)
		}
		if fast != general {
			t.Fatalf("%s:\nfast    %+v\ngeneral %+v", line, fast, general)
		}
	}
	if fastAccepted < 300 {
		t.Fatalf("fast path accepted only %d lines", fastAccepted)
	}
}
