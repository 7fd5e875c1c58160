package definition

import (
	"strings"
	"testing"
)

func TestSchemaNames(t *testing.T) {
	const two = `{"type":"record","name":"Top","fields":[
  {"name":"c0","type":{"type":"record","name":"Card","fields":[{"name":"id","type":"string"}]}},
  {"name":"inner","type":{"type":"record","name":"Inner","namespace":"ns","fields":[
    {"name":"c1","type":{"type":"record","name":"Card","fields":[{"name":"id","type":"long"}]}},
    {"name":"c2","type":%s}]}},
  {"name":"eid","type":"string"},{"name":"t","type":"long"}]}`
	cases := []struct {
		ref, kind, err string
	}{
		{`"Card"`, "", `type name "Card" is ambiguous`},
		{`"ns.Card"`, "long", ""},
	}
	for _, tc := range cases {
		schema := strings.Replace(two, "%s", tc.ref, 1)
		root, _, err := parseSchema(schema)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want %q", tc.ref, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.ref, err)
		}
		c2 := root.fields[1].typ.fields[1].typ
		if got := c2.fields[0].typ.kind.String(); got != tc.kind {
			t.Errorf("%s: inner.c2.id is %s, want %s", tc.ref, got, tc.kind)
		}
	}
	// Within one namespace a short name is the only reading.
	one := `{"type":"record","name":"Top","namespace":"a.b","fields":[
  {"name":"k","type":{"type":"enum","name":"K","symbols":["X"]}},
  {"name":"n","type":{"type":"record","name":"N","namespace":"c","fields":[{"name":"k2","type":"a.b.K"}]}},
  {"name":"k3","type":"K"}]}`
	root, _, err := parseSchema(one)
	if err != nil {
		t.Fatal(err)
	}
	if root.fields[2].typ != root.fields[0].typ || root.fields[1].typ.fields[0].typ != root.fields[0].typ || root.fields[0].typ.name != "a.b.K" {
		t.Fatal("references to a.b.K do not resolve to it")
	}
}
