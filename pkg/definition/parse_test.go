package definition

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

const minimal = `input:
  event_id: id
  entity_id: card.id
  event_time: ts
windows: [1h:1m]
features:
  - name: n
    agg: count
    windows: [1h]
`

func TestParseExample(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "card-velocity-1" || d.Input.EntityID != "card.id" || d.Input.AmountExponent != 2 || !d.Input.HasAmountExponent {
		t.Fatalf("input %+v", d.Input)
	}
	if got, want := d.SchemaFile(), "../../examples/features/card_transaction.avsc"; got != want {
		t.Fatalf("schema file %q, want %q", got, want)
	}
	specs, _ := window.ParseSpecs("1m:1s,10m:10s,1h:1m,24h:1h")
	want := Spec{Windows: specs, Filters: 3, Distincts: 2, Features: []FeatureSpec{
		{Name: "txn_count", Agg: AggCount, Windows: []int{0, 2, 3}, Filter: -1, Distinct: -1},
		{Name: "spend", Agg: AggSum, Windows: []int{2, 3}, Filter: -1, Distinct: -1},
		{Name: "declines", Agg: AggCount, Windows: []int{1}, Filter: 0, Distinct: -1},
		{Name: "distinct_merchants", Agg: AggDistinctCount, Windows: []int{3}, Filter: -1, Distinct: 0, MaxExact: 64},
		{Name: "card_not_present", Agg: AggCount, Windows: []int{2}, Filter: 1, Distinct: -1},
		{Name: "max_amount", Agg: AggMax, Windows: []int{3}, Filter: -1, Distinct: -1},
		{Name: "distinct_mcc", Agg: AggDistinctCount, Windows: []int{2}, Filter: -1, Distinct: 1, MaxExact: 32},
		{Name: "large_approved", Agg: AggCount, Windows: []int{3}, Filter: 2, Distinct: -1},
	}}
	if got := d.Spec(); !reflect.DeepEqual(got, want) {
		t.Fatalf("spec\n%+v\nwant\n%+v", got, want)
	}
	if d.Distincts[0] != "merchant.id" || d.Distincts[1] != "merchant.mcc" {
		t.Fatalf("distincts %v", d.Distincts)
	}
}

// A JSON file, a reordered and recommented YAML file, and a file with
// predicates in another order are the same definition: the same hash and the
// same spec. Any change of meaning changes the hash.
func TestHashIsCanonical(t *testing.T) {
	yamlSrc := `version: v1
input: {event_id: id, entity_id: card.id, event_time: ts, amount: amt}
windows: [1h:1m, 24h:1h]
features:
  - {name: n, agg: count, windows: [1h], where: [{field: s, in: [A, B]}, {field: x, gt: 3}]}
  - {name: m, agg: count, windows: [24h], where: [{field: x, gt: 3}, {field: s, in: [B, A]}]}
`
	jsonSrc := "{\n\t\"features\": [\n\t\t{\"windows\": [\"1h\"], \"agg\": \"count\", \"name\": \"n\", \"where\": [{\"field\": \"s\", \"in\": [\"A\", \"B\"]}, {\"gt\": 3, \"field\": \"x\"}]},\n" +
		"\t\t{\"name\": \"m\", \"agg\": \"count\", \"windows\": [\"24h\"], \"where\": [{\"field\": \"x\", \"gt\": 3}, {\"field\": \"s\", \"in\": [\"B\", \"A\"]}]}\n\t],\n" +
		"\t\"windows\": [\"1h:1m\", \"24h:1h\"],\n\t\"input\": {\"entity_id\": \"card.id\", \"event_id\": \"id\", \"event_time\": \"ts\", \"amount\": \"amt\"},\n\t\"version\": \"v1\"\n}\n"
	a := mustParse(t, "a.yaml", yamlSrc)
	b := mustParse(t, "b.json", jsonSrc)
	if a.Hash() != b.Hash() || !reflect.DeepEqual(a.Spec(), b.Spec()) {
		t.Fatalf("same definition, hashes %s and %s, specs %+v and %+v", a.Hash(), b.Hash(), a.Spec(), b.Spec())
	}
	if len(a.Filters) != 1 || a.Features[1].Filter != 0 {
		t.Fatalf("equal filters are not shared: %d filters", len(a.Filters))
	}
	if h := a.Hash(); len(h) != 16 {
		t.Fatalf("hash %q is not 16 hex digits", h)
	}
	for _, change := range []struct{ from, to string }{
		{"version: v1", "version: v2"},
		{"gt: 3}]}\n  - {name: m", "gt: 4}]}\n  - {name: m"},
		{"[1h:1m, 24h:1h]", "[1h:30s, 24h:1h]"},
		{"amount: amt}", "amount: amt2}"},
		{"name: m, agg: count", "name: m2, agg: count"},
		{"windows: [24h], where", "windows: [24h, 1h], where"},
	} {
		c := mustParse(t, "c.yaml", strings.Replace(yamlSrc, change.from, change.to, 1))
		if c.Hash() == a.Hash() {
			t.Errorf("changing %q to %q keeps hash %s", change.from, change.to, a.Hash())
		}
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name, src string
		want      string // the error text, from the line on
	}{
		{"empty", ``, "t.yaml: empty file"},
		{"not yaml", "input: [", "t.yaml: not YAML or JSON"},
		{"two documents", minimal + "---\nx: 1\n", "t.yaml:10: more than one YAML document"},
		{"top-level list", "- a\n", "t.yaml:1: want a mapping, got a list"},
		{"unknown top key", minimal + "extra: 1\n", "t.yaml:10: extra: unknown key; allowed here: version, input, windows, features"},
		{"duplicate key", minimal + "windows: [1m:1s]\n", "t.yaml:10: windows: duplicate key (first at line 5)"},
		{"missing input", "windows: [1h:1m]\nfeatures: []\n", "t.yaml:1: input: missing"},
		{"unknown input key", strings.Replace(minimal, "event_time: ts\n", "event_time: ts\n  entity: x\n", 1), "t.yaml:5: input.entity: unknown key"},
		{"missing entity", strings.Replace(minimal, "  entity_id: card.id\n", "", 1), "t.yaml:2: input.entity_id: missing"},
		{"bad path", strings.Replace(minimal, "card.id", "card..id", 1), `t.yaml:3: input.entity_id: "card..id" is not a dot path`},
		{"path is a list", strings.Replace(minimal, "card.id", "[a]", 1), "t.yaml:3: input.entity_id: want a value, got a list"},
		{"null path", strings.Replace(minimal, "card.id", "~", 1), "t.yaml:3: input.entity_id: want a value, got null"},
		{"exponent not int", strings.Replace(minimal, "event_time: ts\n", "event_time: ts\n  amount: a\n  amount_exponent: 2.5\n", 1), `t.yaml:6: input.amount_exponent: want a whole number, got "2.5"`},
		{"exponent range", strings.Replace(minimal, "event_time: ts\n", "event_time: ts\n  amount: a\n  amount_exponent: 19\n", 1), "t.yaml:6: input.amount_exponent: 19 is not a whole number in 0..18"},
		{"exponent without amount", strings.Replace(minimal, "event_time: ts\n", "event_time: ts\n  amount_exponent: 2\n", 1), "input.amount: missing, but amount_exponent"},
		{"bad rounding", strings.Replace(minimal, "event_time: ts\n", "event_time: ts\n  amount: a\n  double_rounding: up\n", 1), `t.yaml:6: input.double_rounding: "up" is not a rounding rule`},
		{"windows empty", strings.Replace(minimal, "[1h:1m]", "[]", 1), "t.yaml:5: windows: empty"},
		{"window syntax", strings.Replace(minimal, "[1h:1m]", "[1h]", 1), `t.yaml:5: windows[0]: window spec "1h": want W:b`},
		{"window comma", strings.Replace(minimal, "[1h:1m]", "[\"1h:1m,2h:1m\"]", 1), "windows[0]: one W:b per list entry"},
		{"window not multiple", strings.Replace(minimal, "[1h:1m]", "[1h:7m]", 1), "t.yaml:5: windows[0]: window spec \"1h:7m\": window length 1h is not a multiple of bucket width 7m"},
		{"window twice", strings.Replace(minimal, "[1h:1m]", "[1h:1m, 60m:30s]", 1), "t.yaml:5: windows[1]: window length 1h already given at line 5"},
		{"features empty", strings.Replace(minimal, "features:\n  - name: n\n    agg: count\n    windows: [1h]\n", "features: []\n", 1), "t.yaml:6: features: empty"},
		{"feature unknown key", minimal + "    filter: x\n", "t.yaml:10: features[0].filter: unknown key; allowed here: name, agg, windows, field, where, max_exact"},
		{"feature bad name", strings.Replace(minimal, "name: n", "name: 1n", 1), `t.yaml:7: features[0].name: "1n" is not a valid name`},
		{"feature twice", minimal + "  - {name: n, agg: count, windows: [1h]}\n", "t.yaml:10: features[1].name: feature n already declared at line 7"},
		{"bad agg", strings.Replace(minimal, "agg: count", "agg: avg", 1), `t.yaml:8: features[0].agg: "avg" is not an aggregate; use one of count, sum, min, max, distinct_count`},
		{"unknown window", strings.Replace(minimal, "windows: [1h]", "windows: [5m]", 1), `t.yaml:9: features[0].windows[0]: no window "5m" in windows (1h)`},
		{"window listed twice", strings.Replace(minimal, "windows: [1h]", "windows: [1h, 1h]", 1), "t.yaml:9: features[0].windows[1]: window 1h listed twice"},
		{"sum without amount", strings.Replace(minimal, "agg: count", "agg: sum", 1), "t.yaml:8: features[0].agg: sum is over the amount, and input.amount is not mapped"},
		{"distinct without field", strings.Replace(minimal, "agg: count", "agg: distinct_count", 1), "t.yaml:7: features[0].field: missing"},
		{"count with field", minimal + "    field: x\n", "t.yaml:10: features[0].field: only distinct_count takes a field"},
		{"max_exact range", strings.Replace(minimal, "agg: count", "agg: distinct_count\n    field: m.id\n    max_exact: 0", 1), "t.yaml:10: features[0].max_exact: 0 is not a whole number in 1..4096"},
		{"max_exact on count", minimal + "    max_exact: 5\n", "features[0].max_exact: only distinct_count takes max_exact"},
		{"where empty", minimal + "    where: []\n", "t.yaml:10: features[0].where: empty"},
		{"where not list", minimal + "    where: {field: s, eq: A}\n", "t.yaml:10: features[0].where: want a list, got a mapping"},
		{"predicate without field", minimal + "    where: [{eq: A}]\n", "t.yaml:10: features[0].where[0].field: missing"},
		{"predicate without op", minimal + "    where: [{field: s}]\n", "t.yaml:10: features[0].where[0]: no comparison"},
		{"predicate two ops", minimal + "    where: [{field: s, gt: 1, lt: 3}]\n", "t.yaml:10: features[0].where[0]: more than one comparison"},
		{"predicate unknown op", minimal + "    where: [{field: s, like: A}]\n", "t.yaml:10: features[0].where[0].like: unknown key"},
		{"in not list", minimal + "    where: [{field: s, in: A}]\n", `t.yaml:10: features[0].where[0].in: want a list, got "A"`},
		{"in empty", minimal + "    where: [{field: s, in: []}]\n", "t.yaml:10: features[0].where[0].in: want 1..1024 values, got 0"},
		{"eq null", minimal + "    where: [{field: s, eq: null}]\n", "t.yaml:10: features[0].where[0].eq: want a constant, got null (test for null with is_null)"},
		{"is_null not bool", minimal + "    where: [{field: s, is_null: yes}]\n", `t.yaml:10: features[0].where[0].is_null: want true or false, got "yes"`},
		{"alias", "x: &a 1\n" + minimal, "t.yaml:1: x: unknown key"},
		{"alias value", strings.Replace(minimal, "event_id: id", "event_id: &a id", 1), "t.yaml:2: input.event_id: anchors and aliases are not supported"},
		{"too deep", strings.Replace(minimal, "card.id", strings.Repeat("a.", 16)+"b", 1), "is 17 fields deep, more than 16"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("parsed; want an error containing %q", tc.want)
			}
			var de *Error
			if !errors.As(err, &de) || de.File != "t.yaml" {
				t.Fatalf("error %v (%T) is not a located *Error", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n  %v\nwant it to contain\n  %s", err, tc.want)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	var b strings.Builder
	b.WriteString(minimal)
	for i := 0; i < 33; i++ {
		b.WriteString("  - {name: f" + strings.Repeat("x", i) + ", agg: count, windows: [1h], where: [{field: s, eq: v" + strings.Repeat("x", i) + "}]}\n")
	}
	if _, err := Parse("t.yaml", []byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than 32 different filters") {
		t.Fatalf("33 filters: %v", err)
	}
	b.Reset()
	b.WriteString(minimal)
	for i := 0; i < 33; i++ {
		b.WriteString("  - {name: d" + strings.Repeat("x", i) + ", agg: distinct_count, windows: [1h], field: f" + strings.Repeat("x", i) + "}\n")
	}
	if _, err := Parse("t.yaml", []byte(b.String())); err == nil || !strings.Contains(err.Error(), "more than 32 distinct fields") {
		t.Fatalf("33 distinct fields: %v", err)
	}
	if _, err := Parse("t.yaml", make([]byte, maxDefinitionBytes+1)); err == nil {
		t.Fatal("an oversized file parsed")
	}
}

func TestExampleFilesAreInSync(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(d.SchemaFile())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(d, string(schema), limitsForTest); err != nil {
		t.Fatal(err)
	}
}

var limitsForTest = codec.Limits{}

// The examples in docs/features.md are the real thing: the YAML block is the
// example file (same hash), and the JSON block parses and compiles.
func TestDocsExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/features.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	for rest := string(doc); ; {
		i := strings.Index(rest, "```")
		if i < 0 {
			break
		}
		rest = rest[i+3:]
		nl := strings.IndexByte(rest, '\n')
		lang := rest[:nl]
		end := strings.Index(rest, "```")
		blocks[lang] = append(blocks[lang], rest[nl+1:end])
		rest = rest[end+3:]
	}
	if len(blocks["yaml"]) != 1 || len(blocks["json"]) != 2 {
		t.Fatalf("docs/features.md has %d yaml and %d json blocks; this test expects 1 and 2", len(blocks["yaml"]), len(blocks["json"]))
	}
	file, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inDoc := mustParse(t, "features.md", blocks["yaml"][0])
	if inDoc.Hash() != file.Hash() || !reflect.DeepEqual(inDoc.Spec(), file.Spec()) {
		t.Fatal("the YAML example in docs/features.md differs from examples/features/card_features.yaml")
	}
	j := mustParse(t, "features.md", blocks["json"][1])
	if _, err := Compile(j, exampleSchema(t), codec.Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := goavroCodec(blocks["json"][0]); err != nil {
		t.Fatalf("the abridged schema in docs/features.md does not parse: %v", err)
	}
}

func goavroCodec(schema string) (*goavro.Codec, error) { return goavro.NewCodec(schema) }
