package definition

import (
	"math/big"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

func paymentSchema(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("../../examples/features/payment_event.avsc")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func paymentDef(t testing.TB) *Definition {
	t.Helper()
	d, err := LoadFile("../../examples/features/payment_groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// paymentRecord is a valid record of the payment schema; tests change it.
func paymentRecord() map[string]any {
	return map[string]any{
		"txn_id":    "t-1",
		"card":      map[string]any{"id": "card-A", "bin": goavro.Union("string", "411111")},
		"device_id": goavro.Union("string", "dev-1"),
		"ip":        goavro.Union("string", "10.0.0.1"),
		"merchant":  goavro.Union("com.example.payments.Merchant", map[string]any{"id": "m-1", "mcc": "5411"}),
		"amount":    big.NewRat(123456, 100),
		"ts":        int64(1_700_000_000_123_999),
		"status":    "DECLINED",
	}
}

func encodeWith(t testing.TB, schema string, rec map[string]any) []byte {
	t.Helper()
	c, err := goavro.NewCodec(schema)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.BinaryFromNative(nil, rec)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// paymentBase is a one-group definition over the payment schema; line
// numbers in TestCompileGroupErrors refer to it.
const paymentBase = `input:
  event_id: txn_id
  entity_id: card.id
  event_time: ts
  amount: amount
  amount_exponent: 2
windows: [1h:1m]
features:
  - {name: n, agg: count, windows: [1h]}
groups:
  - name: device
    key: device_id
    windows: [1h:1m]
    features:
      - {name: n, agg: count, windows: [1h]}
`

func TestCompileGroupErrors(t *testing.T) {
	schema := paymentSchema(t)
	rep := func(from, to string) string { return strings.Replace(paymentBase, from, to, 1) }
	cases := []struct{ name, def, schema, want string }{
		{"key not in schema", rep("key: device_id", "key: device"), "", `t.yaml:12: groups[0].key: path device: the top-level record com.example.payments.PaymentEvent has no field "device" (fields: txn_id, card, device_id, ip, merchant, amount, ts, status)`},
		{"key nested missing", rep("key: device_id", "key: merchant.name"), "", `t.yaml:12: groups[0].key: path merchant.name: record com.example.payments.Merchant (at merchant) has no field "name"`},
		{"key an enum", rep("key: device_id", "key: status"), "", "t.yaml:12: groups[0].key: path status is a enum com.example.payments.Status; a group key must be a string, bytes, int or long"},
		{"key a decimal", rep("key: device_id", "key: amount"), "", "t.yaml:12: groups[0].key: path amount is a bytes decimal(18,2); a group key must be a string, bytes, int or long"},
		{"key a record", rep("key: device_id", "key: merchant"), "", "t.yaml:12: groups[0].key: path merchant is a record com.example.payments.Merchant; map a field of a primitive"},
		{"group enum symbol", paymentBase + "      - {name: d, agg: count, windows: [1h], where: [{field: status, eq: DECLINE}]}\n", "",
			`t.yaml:16: groups[0].features[1].where[0].eq: field status (enum com.example.payments.Status) has no symbol "DECLINE"`},
		{"group comparison", paymentBase + "      - {name: d, agg: count, windows: [1h], where: [{field: ip, gt: a}]}\n", "",
			"t.yaml:16: groups[0].features[1].where[0].gt: field ip (string): strings take eq, ne, in and not_in, not gt"},
		{"group distinct decimal", paymentBase + "      - {name: d, agg: distinct_count, field: amount, windows: [1h]}\n", "",
			"t.yaml:16: groups[0].features[1].field: path amount is a bytes decimal(18,2); distinct values must be"},
		{"group distinct missing", paymentBase + "      - {name: d, agg: distinct_count, field: card.pan, windows: [1h]}\n", "",
			`t.yaml:16: groups[0].features[1].field: path card.pan: record com.example.payments.Card (at card) has no field "pan"`},
		{"second group key", paymentBase + "  - {name: ip, key: txn, windows: [1h:1m], features: [{name: n, agg: count, windows: [1h]}]}\n", "",
			`t.yaml:16: groups[1].key: path txn: the top-level record`},
		{"wide union key", rep("key: device_id", "key: u"), `{"type":"record","name":"R","fields":[{"name":"txn_id","type":"string"},{"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},{"name":"u","type":["null","string","long"]},{"name":"ts","type":"long"},{"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}}]}`,
			`t.yaml:12: groups[0].key: path u: field u is a union [null, string, long]; only T and ["null", T] unions can be mapped`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.schema
			if s == "" {
				s = schema
			}
			_, err := Compile(mustParse(t, "t.yaml", tc.def), s, codec.Limits{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n  %v\nwant it to contain\n  %s", err, tc.want)
			}
		})
	}
	// The key types that compile: string and nullable string above; bytes,
	// int and long, nullable or not, and a path through a nullable record.
	for _, key := range []string{"device_id", "ip", "merchant.id", "card.bin", "txn_id"} {
		if _, err := Compile(mustParse(t, "t.yaml", rep("key: device_id", "key: "+key)), schema, codec.Limits{}); err != nil {
			t.Errorf("key %s: %v", key, err)
		}
	}
	if _, err := Compile(mustParse(t, "t.yaml", rep("key: device_id", "key: k")), keysSchema, codec.Limits{}); err != nil {
		t.Errorf("bytes key: %v", err)
	}
}

// keysSchema has keys of every type a key can be, for the payment base.
const keysSchema = `{"type":"record","name":"K","fields":[
 {"name":"txn_id","type":"string"},
 {"name":"card","type":{"type":"record","name":"C","fields":[{"name":"id","type":"string"}]}},
 {"name":"k","type":"bytes"},
 {"name":"uid","type":["null","long"]},
 {"name":"shop","type":"int"},
 {"name":"ts","type":"long"},
 {"name":"amount","type":{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}}]}`

// The example's groups over records with keys present, null, empty, at and
// over the length limit, and not UTF-8; every word checked by hand.
func TestDecodeGroupKeys(t *testing.T) {
	c := mustCompile(t, paymentDef(t), paymentSchema(t))
	str := func(s string) any { return goavro.Union("string", s) }
	cardA := hashOf('s', "card-A")
	// device: distinct card.id (slot 0), no filters. ip: filter 0 status eq
	// DECLINED, distinct card.id (slot 0). The record is DECLINED.
	devExt := []uint64{1 << 32, cardA}
	ipExt := []uint64{1<<0 | 1<<32, cardA}
	cases := []struct {
		name         string
		device, ip   any // the union values
		change       func(map[string]any)
		reason       codec.Reason
		detail       string
		devKey, ipKy string
	}{
		{name: "both keys", device: str("dev-1"), ip: str("10.0.0.1"), devKey: "dev-1", ipKy: "10.0.0.1"},
		{name: "device null", device: nil, ip: str("10.0.0.1"), devKey: "", ipKy: "10.0.0.1"},
		{name: "ip empty", device: str("dev-1"), ip: str(""), devKey: "dev-1", ipKy: ""},
		{name: "both null", device: nil, ip: nil},
		{name: "256 bytes", device: str(strings.Repeat("d", 256)), ip: str("é"), devKey: strings.Repeat("d", 256), ipKy: "é"},
		{name: "257 bytes", device: str(strings.Repeat("d", 257)), ip: str("10.0.0.1"), reason: "invalid:device_id", detail: "device_id is 257 bytes, over the limit of 256"},
		{name: "not UTF-8", device: str("dev-1"), ip: str("10.0.0.\xff"), reason: "invalid:ip", detail: "ip is not valid UTF-8"},
		{name: "first group first", device: str("\xc3"), ip: str(strings.Repeat("i", 300)), reason: "invalid:device_id", detail: "device_id is not valid UTF-8"},
		{name: "in-place rules first", device: str("\xc3"), ip: nil, change: func(m map[string]any) { m["card"] = map[string]any{"id": "", "bin": nil} },
			reason: "invalid:card.id", detail: "card.id is missing or empty"},
		{name: "null in-place key still an error", device: str("dev-1"), ip: nil, change: func(m map[string]any) { m["txn_id"] = "" },
			reason: "invalid:txn_id"},
	}
	var tx codec.Transaction // reused across cases, as a pipeline does
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := paymentRecord()
			rec["device_id"], rec["ip"] = tc.device, tc.ip
			if tc.change != nil {
				tc.change(rec)
			}
			rej := c.Decoder().Decode(encodeWith(t, paymentSchema(t), rec), 0, false, &tx)
			if tc.reason != "" {
				if rej == nil || rej.Reason != tc.reason || !strings.Contains(rej.Detail, tc.detail) {
					t.Fatalf("rejection %v, want %s %q", rej, tc.reason, tc.detail)
				}
				return
			}
			if rej != nil {
				t.Fatal(rej)
			}
			if tx.EntityID != "card-A" || !equalExt(tx.Ext, []uint64{1}) || len(tx.Groups) != 2 {
				t.Fatalf("in-place %q ext %x, %d groups", tx.EntityID, tx.Ext, len(tx.Groups))
			}
			for i, w := range []struct {
				key string
				ext []uint64
			}{{tc.devKey, devExt}, {tc.ipKy, ipExt}} {
				g := tx.Groups[i]
				if w.key == "" {
					w.ext = nil // not an event of the group: no words
				}
				if g.Key != w.key || !equalExt(g.Ext, w.ext) {
					t.Errorf("group %d: key %q ext %x, want %q %x", i, g.Key, g.Ext, w.key, w.ext)
				}
			}
		})
	}
	// An approved record clears ip's filter bit and the in-place one.
	rec := paymentRecord()
	rec["status"] = "APPROVED"
	rec["card"] = map[string]any{"id": "card-B", "bin": nil}
	if rej := c.Decoder().Decode(encodeWith(t, paymentSchema(t), rec), 0, false, &tx); rej != nil {
		t.Fatal(rej)
	}
	cardB := hashOf('s', "card-B")
	if !equalExt(tx.Ext, []uint64{0}) || !equalExt(tx.Groups[0].Ext, []uint64{1 << 32, cardB}) || !equalExt(tx.Groups[1].Ext, []uint64{1 << 32, cardB}) {
		t.Fatalf("approved: %x %+v", tx.Ext, tx.Groups)
	}
}

// Int and long keys are their decimal text, bytes keys are held to UTF-8.
func TestDecodeGroupKeyTypes(t *testing.T) {
	src := strings.Replace(paymentBase, "key: device_id", "key: k", 1) +
		"  - {name: user, key: uid, windows: [1h:1m], features: [{name: n, agg: count, windows: [1h]}]}\n" +
		"  - {name: shop, key: shop, windows: [1h:1m], features: [{name: n, agg: count, windows: [1h]}]}\n"
	c := mustCompile(t, mustParse(t, "k.yaml", src), keysSchema)
	rec := func(k string, uid any, shop int32) []byte {
		return encodeWith(t, keysSchema, map[string]any{"txn_id": "t", "card": map[string]any{"id": "c"}, "k": []byte(k),
			"uid": uid, "shop": shop, "ts": int64(1_700_000_000_000), "amount": big.NewRat(1, 1)})
	}
	cases := []struct {
		value  []byte
		keys   []string
		reason codec.Reason
	}{
		{rec("b-1", goavro.Union("long", int64(7)), 42), []string{"b-1", "7", "42"}, ""},
		{rec("", nil, 0), []string{"", "", "0"}, ""},
		{rec("x", goavro.Union("long", int64(-9223372036854775808)), -5), []string{"x", "-9223372036854775808", "-5"}, ""},
		{rec("\xff", nil, 1), nil, "invalid:k"},
		{rec(strings.Repeat("é", 129), nil, 1), nil, "invalid:k"}, // 258 bytes
	}
	for i, tc := range cases {
		var tx codec.Transaction
		rej := c.Decoder().Decode(tc.value, 0, false, &tx)
		if tc.reason != "" {
			if rej == nil || rej.Reason != tc.reason {
				t.Errorf("case %d: %v, want %s", i, rej, tc.reason)
			}
			continue
		}
		if rej != nil {
			t.Fatalf("case %d: %v", i, rej)
		}
		var keys []string
		for _, g := range tx.Groups {
			keys = append(keys, g.Key)
		}
		if !slices.Equal(keys, tc.keys) {
			t.Errorf("case %d: keys %q, want %q", i, keys, tc.keys)
		}
	}
}

// oneGroup is the definition that computes d's group i alone and in place:
// the same mapping with the group's key as entity_id, and the group's
// windows and features.
func oneGroup(d *Definition, i int) *Definition {
	g := d.Groups[i]
	in := d.Input
	in.EntityID = g.Key
	return &Definition{File: d.File, Version: d.Version, Group: g.Name, Input: in,
		Windows: g.Windows, Features: g.Features, Filters: g.Filters, Distincts: g.Distincts}
}

// checkGroupsAgree decodes value with multi and with each of ones (ones[i]
// computes multi's group i alone, keyed in place by the group's key) and
// fails unless group i's key and words are what ones[i] gives the record.
// seen counts the cases met, so that a caller can tell a comparison that
// never happened from one that held.
func checkGroupsAgree(t *testing.T, d *Definition, multi codec.Decoder, ones []codec.Decoder, value []byte, seen map[string]int) {
	t.Helper()
	var tx codec.Transaction
	rej := multi.Decode(value, 0, false, &tx)
	for i, one := range ones {
		var t1 codec.Transaction
		rej1 := one.Decode(value, 0, false, &t1)
		keyReason := codec.Invalid(d.Groups[i].Key)
		switch {
		case rej != nil && rej.Reason == codec.ReasonDecode:
			if rej1 == nil || rej1.Reason != codec.ReasonDecode {
				t.Fatalf("group %d: the groups' decoder rejects %v, the one-group decoder %v; value %x", i, rej, rej1, value)
			}
			seen["decode"]++
		case rej != nil && rej.Reason == keyReason:
			if rej1 == nil || rej1.Reason != keyReason {
				t.Fatalf("group %d: the groups' decoder rejects %v, the one-group decoder %v; value %x", i, rej, rej1, value)
			}
			seen["bad key"]++
			return // later groups' keys were not looked at
		case rej != nil:
			// A rule of the in-place group (its entity key, say), which the
			// one-group definition does not have.
			seen["in-place rule"]++
		case tx.Groups[i].Key == "":
			if rej1 == nil || rej1.Reason != keyReason {
				t.Fatalf("group %d: no key, but the one-group decoder gives %v %+v; value %x", i, rej1, t1, value)
			}
			seen["no key"]++
		default:
			seen["key"]++
			if rej1 != nil {
				t.Fatalf("group %d: key %q, but the one-group decoder rejects %v; value %x", i, tx.Groups[i].Key, rej1, value)
			}
			if t1.EntityID != tx.Groups[i].Key || !equalExt(t1.Ext, tx.Groups[i].Ext) || t1.EventID != tx.EventID ||
				t1.EventTime != tx.EventTime || t1.AmountMinor != tx.AmountMinor {
				t.Fatalf("group %d: %+v\none group: %+v\nvalue %x", i, tx, t1, value)
			}
		}
	}
}

func TestGroupsAgreeWithOneGroupDefinitions(t *testing.T) {
	d := paymentDef(t)
	schema := paymentSchema(t)
	multi := mustCompile(t, d, schema).Decoder()
	var ones []codec.Decoder
	for i := range d.Groups {
		ones = append(ones, mustCompile(t, oneGroup(d, i), schema).Decoder())
	}
	root, gc, err := parseSchema(schema)
	if err != nil {
		t.Fatal(err)
	}
	vg := &gen{r: rand.New(rand.NewPCG(27, 27))}
	seen := map[string]int{}
	for i := 0; i < 3000; i++ {
		value, err := gc.BinaryFromNative(nil, vg.value(root, 0))
		if err != nil {
			t.Fatal(err)
		}
		checkGroupsAgree(t, d, multi, ones, value, seen)
		checkGroupsAgree(t, d, multi, ones, mutate(vg.r, value), seen)
	}
	t.Logf("cases %v", seen)
	for _, k := range []string{"decode", "bad key", "in-place rule", "no key", "key"} {
		if seen[k] < 20 {
			t.Errorf("case %q met %d times; the generator does not reach it", k, seen[k])
		}
	}
}

func TestGroupReasons(t *testing.T) {
	c := mustCompile(t, paymentDef(t), paymentSchema(t))
	want := []codec.Reason{"decode", "too_large", "invalid:txn_id", "invalid:card.id", "invalid:amount", "invalid:ts", "invalid:device_id", "invalid:ip"}
	if got := c.Reasons(); !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %v, want %v", got, want)
	}
	// A key that is also the event id is one reason.
	c2 := mustCompile(t, mustParse(t, "t.yaml", strings.Replace(paymentBase, "key: device_id", "key: txn_id", 1)), paymentSchema(t))
	if got, want := c2.Reasons(), []codec.Reason{"decode", "too_large", "invalid:txn_id", "invalid:card.id", "invalid:amount", "invalid:ts"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("reasons %v, want %v", got, want)
	}
}

func TestEngineSpecsOfTheGroupsExample(t *testing.T) {
	specs, err := EngineSpecs(paymentDef(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name, key string
		cols      []string
	}{
		{"card", "card.id", []string{"txn_count_1m", "txn_count_1h", "txn_count_24h", "spend_1h", "spend_24h", "declines_10m"}},
		{"device", "device_id", []string{"distinct_cards_24h", "spend_24h", "txn_count_1h", "distinct_cards_exact"}},
		{"ip", "ip", []string{"attempts_5m", "declines_1h", "distinct_cards_1h", "distinct_cards_exact"}},
	}
	if len(specs) != len(want) {
		t.Fatalf("%d group specs, want %d", len(specs), len(want))
	}
	for i, w := range want {
		var cols []string
		for _, c := range specs[i].Spec.Columns() {
			cols = append(cols, c.Name)
		}
		if specs[i].Name != w.name || specs[i].Key != w.key || !slices.Equal(cols, w.cols) {
			t.Errorf("group %d: %s key %s columns %v, want %+v", i, specs[i].Name, specs[i].Key, cols, w)
		}
	}
	if specs[2].Spec.Filters != 1 || specs[2].Spec.Distincts != 1 || specs[1].Spec.Filters != 0 {
		t.Errorf("ip: %d filters %d distincts; device %d filters", specs[2].Spec.Filters, specs[2].Spec.Distincts, specs[1].Spec.Filters)
	}
	// [0] is EngineSpec, and a definition without groups has one spec.
	one, err := EngineSpecs(mustParse(t, "m.yaml", minimal))
	if err != nil || len(one) != 1 || one[0].Name != DefaultGroup || one[0].Key != "card.id" {
		t.Fatalf("%+v %v", one, err)
	}
	top, err := EngineSpec(paymentDef(t))
	if err != nil || !reflect.DeepEqual(top, specs[0].Spec) {
		t.Fatalf("EngineSpec %+v, EngineSpecs[0] %+v (%v)", top, specs[0].Spec, err)
	}
}

// The example files load and compile, and the groups example is what the
// groups section of docs/features.md shows.
func TestGroupsExampleFiles(t *testing.T) {
	d := paymentDef(t)
	schema, err := os.ReadFile(d.SchemaFile())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(d, string(schema), limitsForTest); err != nil {
		t.Fatal(err)
	}
}
