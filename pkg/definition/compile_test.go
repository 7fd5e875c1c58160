package definition

import (
	"fmt"
	"math"
	"math/big"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

func exampleSchema(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("../../examples/features/card_transaction.avsc")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// base maps the example schema; each case adds or changes one thing.
const base = `input:
  event_id: txn_id
  entity_id: card.id
  event_time: ts
  amount: amount
  amount_exponent: 2
windows: [1h:1m]
features:
  - {name: n, agg: count, windows: [1h]}
`

func TestCompileErrors(t *testing.T) {
	schema := exampleSchema(t)
	rep := func(from, to string) string { return strings.Replace(base, from, to, 1) }
	where := func(pred string) string {
		return base + "  - {name: f, agg: count, windows: [1h], where: [" + pred + "]}\n"
	}
	distinct := func(field string) string {
		return base + "  - {name: d, agg: distinct_count, windows: [1h], field: " + field + "}\n"
	}
	cases := []struct {
		name, def, schema, want string
	}{
		{"missing top field", rep("txn_id", "txn"), "", `t.yaml:2: input.event_id: path txn: the top-level record com.example.payments.CardTransaction has no field "txn" (fields: txn_id, card, merchant, amount, currency, ts, status, card_present, channel, tags)`},
		{"missing nested field", rep("card.id", "card.number"), "", `t.yaml:3: input.entity_id: path card.number: record com.example.payments.Card (at card) has no field "number" (fields: id, bin)`},
		{"through a non-record", rep("card.id", "txn_id.x"), "", "t.yaml:3: input.entity_id: path txn_id.x: field txn_id is a string, not a record, so it has no field x"},
		{"record as id", rep("card.id", "merchant"), "", "t.yaml:3: input.entity_id: path merchant is a record com.example.payments.Merchant; map a field of a primitive"},
		{"map as id", rep("card.id", "tags"), "", "path tags is a map"},
		{"enum as id", rep("card.id", "status"), "", "t.yaml:3: input.entity_id: path status is a enum com.example.payments.Status; an id must be a string, bytes, int or long"},
		{"time micros ok, string time", rep("event_time: ts", "event_time: currency"), "", "t.yaml:4: input.event_time: path currency is a string; the event time must be a long"},
		{"decimal without exponent", rep("  amount_exponent: 2\n", ""), "", "t.yaml:5: input.amount_exponent: missing; amount amount is a bytes decimal(18,2)"},
		{"amount string", rep("amount: amount", "amount: currency"), "", "t.yaml:5: input.amount: path currency is a string; the amount must be"},
		{"int amount with exponent", rep("amount: amount", "amount: n"), `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},{"name":"ts","type":"long"},{"name":"n","type":"long"}]}`,
			"t.yaml:6: input.amount_exponent: amount n is a long, already in minor units; remove amount_exponent"},
		{"double refused", rep("amount: amount", "amount: d"), `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},{"name":"ts","type":"long"},{"name":"d","type":"double"}]}`,
			"t.yaml:5: input.amount: amount d is a double; binary floating point cannot hold most decimal amounts exactly, so it is refused unless double_rounding"},
		{"rounding on decimal", rep("  amount_exponent: 2\n", "  amount_exponent: 2\n  double_rounding: half_even\n"), "", "t.yaml:7: input.double_rounding: amount amount is a bytes decimal(18,2), not a float or double; remove double_rounding"},
		{"int time refused", base, `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},{"name":"ts","type":"int"},{"name":"amount","type":"long"}]}`,
			"input.event_time: path ts is a int; the event time must be a long"},
		{"local timestamp refused", base, `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},{"name":"ts","type":{"type":"long","logicalType":"local-timestamp-millis"}},{"name":"amount","type":"long"}]}`,
			"path ts is a long local-timestamp-millis"},
		{"wide union", rep("card.id", "u"), `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"u","type":["null","string","long"]},{"name":"ts","type":"long"},{"name":"amount","type":"long"}]}`,
			`input.entity_id: path u: field u is a union [null, string, long]; only T and ["null", T] unions can be mapped`},
		{"schema not a record", base, `"string"`, "writer schema is a string, not a record"},
		{"schema does not parse", base, `{"type":"record","name":"R","fields":[{"name":"a","type":"nope"}]}`, "writer schema does not parse"},
		{"enum symbol", where("{field: status, in: [DECLINED, DECLINE]}"), "", `t.yaml:10: features[1].where[0].in: field status (enum com.example.payments.Status) has no symbol "DECLINE"; its symbols are APPROVED, DECLINED, REVERSED`},
		{"enum comparison", where("{field: status, gt: APPROVED}"), "", "t.yaml:10: features[1].where[0].gt: field status (enum com.example.payments.Status): enums take eq, ne, in and not_in, not gt"},
		{"string comparison", where("{field: txn_id, lt: b}"), "", "strings take eq, ne, in and not_in, not lt"},
		{"boolean constant", where("{field: card_present, eq: yes}"), "", `t.yaml:10: features[1].where[0].eq: field card_present is a boolean; compare it with true or false, not "yes"`},
		{"boolean in", where("{field: card_present, in: [true]}"), "", "booleans take eq and ne, not in"},
		{"decimal not a number", where("{field: amount, gt: ten}"), "", `t.yaml:10: features[1].where[0].gt: field amount is a bytes decimal(18,2); "ten" is not a number`},
		{"decimal in", where("{field: amount, in: [1, 2]}"), "", "in and not_in apply to ints and longs among numbers"},
		{"hex is not a number", where("{field: amount, gt: 0x10}"), "", `"0x10" is not a number`},
		{"filter on a map", where("{field: tags, eq: x}"), "", "path tags is a map"},
		{"is_null on a record is fine, eq is not", where("{field: merchant, eq: x}"), "", "a record can only be tested with is_null"},
		{"distinct decimal", distinct("amount"), "", "t.yaml:10: features[1].field: path amount is a bytes decimal(18,2); distinct values must be strings, enums, booleans, ints, longs, bytes or fixed"},
		{"distinct missing", distinct("merchant.name"), "", `t.yaml:10: features[1].field: path merchant.name: record com.example.payments.Merchant (at merchant) has no field "name"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := mustParse(t, "t.yaml", tc.def)
			s := tc.schema
			if s == "" {
				s = schema
			}
			_, err := Compile(d, s, codec.Limits{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n  %v\nwant it to contain\n  %s", err, tc.want)
			}
		})
	}
	// And the shapes that compile.
	for _, ok := range []string{
		where("{field: merchant, is_null: true}"),
		where("{field: merchant.country, is_null: false}"),
		where("{field: card_present, eq: false}, {field: status, ne: REVERSED}, {field: amount, lt: 0.005}"),
		where(`{field: merchant.mcc, in: [5411, "5812"]}`),
		distinct("status"), distinct("card_present"), distinct("card.bin"),
	} {
		if _, err := Compile(mustParse(t, "t.yaml", ok), schema, codec.Limits{}); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
}

// exampleRecord is a valid record of the example schema; tests change it.
func exampleRecord() map[string]any {
	return map[string]any{
		"txn_id":       "t-1",
		"card":         map[string]any{"id": "card-A", "bin": goavro.Union("string", "411111")},
		"merchant":     goavro.Union("com.example.payments.Merchant", map[string]any{"id": "m-1", "mcc": "5411", "country": nil}),
		"amount":       big.NewRat(123456, 100), // 1234.56
		"currency":     "EUR",
		"ts":           int64(1_700_000_000_123_999), // micros
		"status":       "DECLINED",
		"card_present": false,
		"channel":      nil,
		"tags":         map[string]any{"a": "b"},
	}
}

func encodeExample(t testing.TB, rec map[string]any) []byte {
	t.Helper()
	c, err := goavro.NewCodec(exampleSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.BinaryFromNative(nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The example definition over one record, every field checked by hand.
func TestDecodeExample(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, exampleSchema(t))
	var tx codec.Transaction
	if rej := c.Decoder().Decode(encodeExample(t, exampleRecord()), 0, false, &tx); rej != nil {
		t.Fatal(rej)
	}
	// Filters: 0 status in [DECLINED] (yes), 1 card_present eq false (yes),
	// 2 status eq APPROVED and amount ≥ 500.00 (no: declined).
	wantExt := []uint64{1<<0 | 1<<1 | 1<<32 | 1<<33, hashOf('s', "m-1"), hashOf('s', "5411")}
	want := codec.Transaction{EventID: "t-1", EntityID: "card-A", AmountMinor: 123456, EventTime: 1_700_000_000_123, Ext: wantExt}
	if !equalTx(tx, want) {
		t.Fatalf("got %+v\nwant %+v", tx, want)
	}

	rec := exampleRecord()
	rec["status"] = "APPROVED"
	rec["card_present"] = true
	rec["merchant"] = nil
	if rej := c.Decoder().Decode(encodeExample(t, rec), 0, false, &tx); rej != nil {
		t.Fatal(rej)
	}
	if want := []uint64{1 << 2, 0, 0}; !equalExt(tx.Ext, want) {
		t.Fatalf("approved, card present, no merchant: ext %x, want %x", tx.Ext, want)
	}
	// YAML writes booleans as true, True or TRUE; all mean the same.
	for _, lit := range []string{"True", "TRUE", "true"} {
		src := strings.Replace(base, "features:\n", "features:\n  - {name: cnp, agg: count, windows: [1h], where: [{field: card_present, eq: "+lit+"}, {field: merchant, is_null: TRUE}]}\n", 1)
		cb := mustCompile(t, mustParse(t, "b.yaml", src), exampleSchema(t))
		rec2 := exampleRecord()
		rec2["merchant"] = nil
		rec2["card_present"] = true
		var tb codec.Transaction
		if rej := cb.Decoder().Decode(encodeExample(t, rec2), 0, false, &tb); rej != nil || len(tb.Ext) != 1 || tb.Ext[0] != 1 {
			t.Fatalf("eq: %s on card_present true, is_null: TRUE on a null merchant: %v %x", lit, rej, tb.Ext)
		}
	}
	rec["amount"] = big.NewRat(49999, 100)
	if rej := c.Decoder().Decode(encodeExample(t, rec), 0, false, &tx); rej != nil || tx.Ext[0] != 0 || tx.AmountMinor != 49999 {
		t.Fatalf("499.99: %v %+v", rej, tx)
	}
}

func hashOf(tag byte, s string) uint64 { return hashTagged(tag, []byte(s)) }

func equalExt(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func equalTx(a, b codec.Transaction) bool {
	return a.EventID == b.EventID && a.EntityID == b.EntityID && a.AmountMinor == b.AmountMinor &&
		a.Currency == b.Currency && a.EventTime == b.EventTime && equalExt(a.Ext, b.Ext)
}

func TestDecodeRejections(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, exampleSchema(t))
	cases := []struct {
		name   string
		change func(map[string]any)
		reason codec.Reason
		detail string
	}{
		{"negative", func(r map[string]any) { r["amount"] = big.NewRat(-5, 1) }, "invalid:amount", "amount in minor units -500 is outside 0..10^15"},
		{"too large", func(r map[string]any) { r["amount"] = big.NewRat(1e14, 1) }, "invalid:amount", "is outside 0..10^15"},
		{"empty id", func(r map[string]any) { r["txn_id"] = "" }, "invalid:txn_id", "txn_id is missing or empty"},
		{"long entity", func(r map[string]any) { r["card"].(map[string]any)["id"] = strings.Repeat("x", 257) }, "invalid:card.id", "card.id is 257 bytes, over the limit of 256"},
		{"bad utf8", func(r map[string]any) { r["card"].(map[string]any)["id"] = "\xff" }, "invalid:card.id", "card.id is not valid UTF-8"},
		{"old time", func(r map[string]any) { r["ts"] = int64(1000) }, "invalid:ts", "ts in milliseconds 1 is before the minimum"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := exampleRecord()
			tc.change(rec)
			var tx codec.Transaction
			rej := c.Decoder().Decode(encodeExample(t, rec), 0, false, &tx)
			if rej == nil || rej.Reason != tc.reason || !strings.Contains(rej.Detail, tc.detail) {
				t.Fatalf("got %v, want %s containing %q", rej, tc.reason, tc.detail)
			}
		})
	}
	// With an exponent below the schema's scale, a value with more fraction
	// digits than the exponent allows is refused, and one without is exact.
	d1 := mustParse(t, "t.yaml", strings.Replace(base, "amount_exponent: 2", "amount_exponent: 1", 1))
	c1 := mustCompile(t, d1, exampleSchema(t))
	rec := exampleRecord()
	var tx codec.Transaction
	rej := c1.Decoder().Decode(encodeExample(t, rec), 0, false, &tx)
	if rej == nil || rej.Reason != "invalid:amount" || rej.Detail != "amount 1234.56 has more fraction digits than amount_exponent allows (amount_exponent 1)" {
		t.Fatalf("1234.56 with exponent 1: %v", rej)
	}
	rec["amount"] = big.NewRat(123450, 100)
	if rej := c1.Decoder().Decode(encodeExample(t, rec), 0, false, &tx); rej != nil || tx.AmountMinor != 12345 || tx.Ext != nil {
		t.Fatalf("1234.50 with exponent 1: %v %+v", rej, tx)
	}
	// Ahead of the partition's max seen time, checked in milliseconds.
	rej = c.Decoder().Decode(encodeExample(t, exampleRecord()), 1_700_000_000_123-24*3600*1000-1, true, &tx)
	if rej == nil || rej.Reason != "invalid:ts" {
		t.Fatalf("ahead: %v", rej)
	}
	big := make([]byte, 1<<20+1)
	if rej := c.Decoder().Decode(big, 0, false, &tx); rej == nil || rej.Reason != codec.ReasonTooLarge {
		t.Fatalf("oversized: %v", rej)
	}
	if rej := c.Decoder().Decode(append(encodeExample(t, exampleRecord()), 0), 0, false, &tx); rej == nil || rej.Reason != codec.ReasonDecode || !strings.Contains(rej.Detail, "1 trailing bytes") {
		t.Fatalf("trailing: %v", rej)
	}
	if rej := c.Decoder().Decode([]byte{6, 't', '-'}, 0, false, &tx); rej == nil || rej.Reason != codec.ReasonDecode || !strings.HasPrefix(rej.Detail, "txn_id: length prefix beyond the end") {
		t.Fatalf("truncated: %v", rej)
	}
}

func TestScaleMinor(t *testing.T) {
	cases := []struct {
		u          int64
		scale, exp int
		want       int64
		p          amountProblem
	}{
		{123456, 2, 2, 123456, amountOK},
		{123456, 2, 3, 1234560, amountOK},
		{123450, 3, 2, 12345, amountOK},
		{123451, 3, 2, 0, amountFraction},
		{-123450, 3, 2, -12345, amountOK},
		{5, 0, 2, 500, amountOK},
		{math.MaxInt64 / 10, 0, 1, math.MaxInt64 / 10 * 10, amountOK},
		{math.MaxInt64/10 + 1, 0, 1, 0, amountRange},
		{math.MinInt64 / 10, 0, 1, math.MinInt64 / 10 * 10, amountOK},
		{1, 0, 19, 0, amountRange},
		{0, 0, 30, 0, amountOK},
		{0, 30, 0, 0, amountOK},
		{1, 30, 0, 0, amountFraction},
		{math.MaxInt64, 19, 0, 0, amountFraction},
		{7000000000000000000, 18, 0, 7, amountOK},
	}
	for _, tc := range cases {
		got, p := scaleMinor(tc.u, tc.scale, tc.exp)
		if got != tc.want || p != tc.p {
			t.Errorf("scaleMinor(%d, %d, %d) = %d, %v; want %d, %v", tc.u, tc.scale, tc.exp, got, p, tc.want, tc.p)
		}
		g2, p2 := scaleMinorBig(big.NewInt(tc.u), tc.scale, tc.exp)
		if g2 != tc.want || p2 != tc.p {
			t.Errorf("scaleMinorBig(%d, %d, %d) = %d, %v; want %d, %v", tc.u, tc.scale, tc.exp, g2, p2, tc.want, tc.p)
		}
	}
}

func TestUnscaled(t *testing.T) {
	cases := []struct {
		b    []byte
		want int64
		ok   bool
	}{
		{nil, 0, true},
		{[]byte{0x00}, 0, true},
		{[]byte{0xff}, -1, true},
		{[]byte{0x80}, -128, true},
		{[]byte{0x00, 0x80}, 128, true},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x85}, -123, true},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, math.MaxInt64, true},
		{[]byte{0, 0, 0, 0, 0, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0}, 0, false},
		{[]byte{0xff, 0x80, 0, 0, 0, 0, 0, 0, 0}, math.MinInt64, true},
		{[]byte{0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 0, false},
	}
	for _, tc := range cases {
		got, ok := unscaled64(tc.b)
		if got != tc.want || ok != tc.ok {
			t.Errorf("unscaled64(%x) = %d, %v; want %d, %v", tc.b, got, ok, tc.want, tc.ok)
		}
		if ok && unscaledBig(tc.b).Int64() != got {
			t.Errorf("unscaledBig(%x) = %v, want %d", tc.b, unscaledBig(tc.b), got)
		}
	}
}

func TestRoundFloat(t *testing.T) {
	cases := []struct {
		x    float64
		bits int
		exp  int
		mode Rounding
		want int64
		p    amountProblem
	}{
		{0.29, 64, 2, RoundHalfEven, 29, amountOK}, // 0.29 × 100 is 28.999999999999996 in floating point
		{1.005, 64, 2, RoundHalfEven, 100, amountOK},
		{1.005, 64, 2, RoundHalfAwayFromZero, 101, amountOK},
		{1.015, 64, 2, RoundHalfEven, 102, amountOK},
		{2.5, 64, 0, RoundHalfEven, 2, amountOK},
		{3.5, 64, 0, RoundHalfEven, 4, amountOK},
		{2.5, 64, 0, RoundHalfAwayFromZero, 3, amountOK},
		{-2.5, 64, 0, RoundHalfAwayFromZero, -3, amountOK},
		{-2.5, 64, 0, RoundHalfEven, -2, amountOK},
		{12.3456, 64, 2, RoundHalfEven, 1235, amountOK},
		{1e15, 64, 2, RoundHalfEven, 1e17, amountOK},
		{1e300, 64, 2, RoundHalfEven, 0, amountRange},
		{5e-324, 64, 2, RoundHalfEven, 0, amountOK},
		{0, 64, 2, RoundHalfEven, 0, amountOK},
		{float64(float32(0.1)), 32, 2, RoundHalfEven, 10, amountOK}, // 0.1f reads as 0.1, not 0.10000000149
		{float64(float32(0.125)), 32, 2, RoundHalfEven, 12, amountOK},
		{math.NaN(), 64, 2, RoundHalfEven, 0, amountNotFinite},
		{math.Inf(1), 64, 2, RoundHalfEven, 0, amountNotFinite},
		{123456789.125, 64, 2, RoundHalfAwayFromZero, 12345678913, amountOK},
	}
	for _, tc := range cases {
		got, p := roundFloat(tc.x, tc.bits, tc.exp, tc.mode)
		if got != tc.want || p != tc.p {
			t.Errorf("roundFloat(%v, %d, %d, %v) = %d, %v; want %d, %v", tc.x, tc.bits, tc.exp, tc.mode, got, p, tc.want, tc.p)
		}
	}
}

func TestRanges(t *testing.T) {
	rat := func(s string) *big.Rat { r, _ := parseRat(s); return r }
	ints := []struct {
		c     string
		scale int
		op    Op
		yes   []int64
		no    []int64
	}{
		{"5.5", 0, OpLt, []int64{5, math.MinInt64}, []int64{6, math.MaxInt64}},
		{"5.5", 0, OpGt, []int64{6}, []int64{5}},
		{"5", 0, OpLe, []int64{5}, []int64{6}},
		{"5", 0, OpGe, []int64{5}, []int64{4}},
		{"5.5", 0, OpEq, nil, []int64{5, 6}},
		{"5.5", 0, OpNe, []int64{5, 6}, nil},
		{"1.23", 2, OpEq, []int64{123}, []int64{122, 124}},
		{"10.005", 4, OpGe, []int64{100050}, []int64{100049}},
		{"1e30", 0, OpLt, []int64{math.MaxInt64}, nil},
		{"-1e30", 0, OpLt, nil, []int64{math.MinInt64}},
		{"-1e30", 0, OpNe, []int64{0}, nil},
		{"9223372036854775807", 0, OpGe, []int64{math.MaxInt64}, []int64{math.MaxInt64 - 1}},
		{"-9223372036854775808.5", 0, OpLe, nil, []int64{math.MinInt64}},
	}
	for _, tc := range ints {
		r := newIntRange(rat(tc.c), tc.scale, tc.op)
		for _, u := range tc.yes {
			if !r.match(u) || !r.matchBig(big.NewInt(u)) {
				t.Errorf("%d at scale %d %s %s: want true", u, tc.scale, tc.op, tc.c)
			}
		}
		for _, u := range tc.no {
			if r.match(u) || r.matchBig(big.NewInt(u)) {
				t.Errorf("%d at scale %d %s %s: want false", u, tc.scale, tc.op, tc.c)
			}
		}
	}
	floats := []struct {
		c   string
		op  Op
		yes []float64
		no  []float64
	}{
		{"0.1", OpGt, []float64{0.1, 0.2}, []float64{0.09999999999999999, math.NaN()}}, // the double 0.1 is above the decimal 0.1
		{"0.1", OpLt, []float64{0.09999999999999999}, []float64{0.1}},
		{"0.1", OpEq, nil, []float64{0.1}},
		{"0.5", OpEq, []float64{0.5}, []float64{math.Nextafter(0.5, 1)}},
		{"0.5", OpNe, []float64{0.4}, []float64{0.5, math.NaN()}},
		{"1e400", OpLt, []float64{math.MaxFloat64}, []float64{math.Inf(1)}},
		{"-1e400", OpGt, []float64{-math.MaxFloat64}, []float64{math.Inf(-1)}},
		{"0", OpGe, []float64{0, math.Copysign(0, -1)}, []float64{-5e-324}},
	}
	for _, tc := range floats {
		r := newFloatRange(rat(tc.c), tc.op)
		for _, x := range tc.yes {
			if !r.match(x) {
				t.Errorf("%v %s %s: want true", x, tc.op, tc.c)
			}
		}
		for _, x := range tc.no {
			if r.match(x) {
				t.Errorf("%v %s %s: want false", x, tc.op, tc.c)
			}
		}
	}
}

// The distinct-value hashes are part of the output contract (they reach
// snapshots and decide sampling): these values must never change. They were
// computed with the C reference implementation (libxxhash 0.8.1, XXH3_64bits
// over tag ‖ payload), not with this package.
func TestHashGolden(t *testing.T) {
	cases := []struct {
		got  uint64
		want uint64
	}{
		{hashOf(tagText, "m-1"), 0x52df4072fde0f202},
		{hashOf(tagBytes, "m-1"), 0x2336f1ff778796f0},
		{hashInt64(1), 0xbf0327e6b4205436},
		{hashInt64(-1), 0x211dfcb80ae4202},
		{hashBoolean(true), 0xb9594eb56775de04},
		{hashOf(tagText, strings.Repeat("x", 300)), 0xf763374a75b53543},
	}
	for i, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("case %d: hash %#x, want %#x", i, tc.got, tc.want)
		}
	}
}

// One decoder serves every partition at once (the registry shares it).
func TestDecoderConcurrent(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, exampleSchema(t))
	values := make([][]byte, 8)
	want := make([]codec.Transaction, 8)
	for i := range values {
		rec := exampleRecord()
		rec["txn_id"] = "t-" + strings.Repeat("x", i)
		rec["merchant"] = goavro.Union("com.example.payments.Merchant", map[string]any{"id": "m-" + strings.Repeat("y", i), "mcc": "5411", "country": nil})
		values[i] = encodeExample(t, rec)
		if rej := c.Decoder().Decode(values[i], 0, false, &want[i]); rej != nil {
			t.Fatal(rej)
		}
	}
	done := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			var tx codec.Transaction
			for n := 0; n < 2000; n++ {
				i := (n + g) % len(values)
				if rej := c.Decoder().Decode(values[i], 0, false, &tx); rej != nil || !equalTx(tx, want[i]) {
					done <- fmt.Errorf("goroutine %d record %d: %v %+v", g, i, rej, tx)
					return
				}
			}
			done <- nil
		}()
	}
	for g := 0; g < 4; g++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestReasons(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, d, exampleSchema(t))
	want := []codec.Reason{"decode", "too_large", "invalid:txn_id", "invalid:card.id", "invalid:amount", "invalid:ts"}
	if got := c.Reasons(); !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %v, want %v", got, want)
	}
	c2 := mustCompile(t, mustParse(t, "i.yaml", wideIntDef), wideSchema)
	if got, want := c2.Reasons(), []codec.Reason{"decode", "too_large", "invalid:who.inner.code", "invalid:label", "invalid:t"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %v, want %v", got, want)
	}
}
