package definition

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// groupsMinimal is one re-keyed group over minimal's mapping plus an amount.
// Line numbers in TestParseGroupErrors refer to it.
const groupsMinimal = `input:
  event_id: id
  entity_id: card.id
  event_time: ts
  amount: amt
windows: [1h:1m]
features:
  - name: n
    agg: count
    windows: [1h]
groups:
  - name: device
    key: device_id
    windows: [5m:5s]
    features:
      - {name: n, agg: count, windows: [5m]}
`

func TestParseGroupsExample(t *testing.T) {
	d, err := LoadFile("../../examples/features/payment_groups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if d.Group != "card" || d.Input.EntityID != "card.id" || len(d.Groups) != 2 {
		t.Fatalf("group %q, entity %q, %d groups", d.Group, d.Input.EntityID, len(d.Groups))
	}
	specs := func(s string) []window.Spec {
		w, err := window.ParseSpecs(s)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	wantTop := Spec{Windows: specs("1m:1s,10m:10s,1h:1m,24h:1h"), Filters: 1, Features: []FeatureSpec{
		{Name: "txn_count", Agg: AggCount, Windows: []int{0, 2, 3}, Filter: -1, Distinct: -1},
		{Name: "spend", Agg: AggSum, Windows: []int{2, 3}, Filter: -1, Distinct: -1},
		{Name: "declines", Agg: AggCount, Windows: []int{1}, Filter: 0, Distinct: -1},
	}}
	if got := d.Spec(); !reflect.DeepEqual(got, wantTop) {
		t.Fatalf("in-place spec\n%+v\nwant\n%+v", got, wantTop)
	}
	// Each group's windows, filter bits and distinct slots are its own and
	// numbered from 0.
	wantGroups := []struct {
		name, key string
		spec      Spec
		distincts []string
	}{
		{"device", "device_id", Spec{Windows: specs("1h:1m,24h:1h"), Distincts: 1, Features: []FeatureSpec{
			{Name: "distinct_cards", Agg: AggDistinctCount, Windows: []int{1}, Filter: -1, Distinct: 0, MaxExact: 64},
			{Name: "spend", Agg: AggSum, Windows: []int{1}, Filter: -1, Distinct: -1},
			{Name: "txn_count", Agg: AggCount, Windows: []int{0}, Filter: -1, Distinct: -1},
		}}, []string{"card.id"}},
		{"ip", "ip", Spec{Windows: specs("5m:5s,1h:1m"), Filters: 1, Distincts: 1, Features: []FeatureSpec{
			{Name: "attempts", Agg: AggCount, Windows: []int{0}, Filter: -1, Distinct: -1},
			{Name: "declines", Agg: AggCount, Windows: []int{1}, Filter: 0, Distinct: -1},
			{Name: "distinct_cards", Agg: AggDistinctCount, Windows: []int{1}, Filter: -1, Distinct: 0, MaxExact: 64},
		}}, []string{"card.id"}},
	}
	for i, w := range wantGroups {
		g := &d.Groups[i]
		if g.Name != w.name || g.Key != w.key || !reflect.DeepEqual(g.Distincts, w.distincts) {
			t.Errorf("group %d: %s key %s distincts %v, want %s key %s %v", i, g.Name, g.Key, g.Distincts, w.name, w.key, w.distincts)
		}
		if got := g.Spec(); !reflect.DeepEqual(got, w.spec) {
			t.Errorf("group %s spec\n%+v\nwant\n%+v", g.Name, got, w.spec)
		}
	}
	if len(d.Groups[1].Filters) != 1 || d.Groups[1].Filters[0].key != d.Filters[0].key {
		t.Fatalf("ip's filter is the same predicate as card's, kept in its own list: %+v", d.Groups[1].Filters)
	}
}

// The in-place group's name defaults to entity; without groups a definition
// is what it was before groups existed.
func TestParseGroupDefaults(t *testing.T) {
	d := mustParse(t, "m.yaml", minimal)
	if d.Group != DefaultGroup || d.Groups != nil {
		t.Fatalf("group %q, groups %v", d.Group, d.Groups)
	}
	g := mustParse(t, "g.yaml", "group: card_2\n"+minimal)
	if g.Group != "card_2" {
		t.Fatalf("group %q", g.Group)
	}
	if mustParse(t, "e.yaml", "group: entity\n"+minimal).Hash() != d.Hash() {
		t.Fatal("group: entity is the default, yet changes the hash")
	}
}

func TestParseGroupErrors(t *testing.T) {
	rep := func(from, to string) string {
		if !strings.Contains(groupsMinimal, from) {
			t.Fatalf("groupsMinimal has no %q", from)
		}
		return strings.Replace(groupsMinimal, from, to, 1)
	}
	addGroupFeature := func(f string) string { return groupsMinimal + "      - " + f + "\n" }
	groupN := func(n int) string {
		var b strings.Builder
		b.WriteString(strings.SplitAfter(groupsMinimal, "groups:\n")[0])
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, "  - {name: g%d, key: k%d, windows: [1m:1s], features: [{name: n, agg: count, windows: [1m]}]}\n", i, i)
		}
		return b.String()
	}
	manyFeatures := func(n int, f func(i int) string) string {
		var b strings.Builder
		b.WriteString(groupsMinimal)
		for i := 0; i < n; i++ {
			b.WriteString("      - " + f(i) + "\n")
		}
		return b.String()
	}
	cases := []struct {
		name, src string
		want      string
	}{
		{"unknown top key lists group keys", groupsMinimal + "extra: 1\n", "t.yaml:17: extra: unknown key; allowed here: version, input, windows, features, group, groups"},
		{"groups not a list", strings.SplitAfter(groupsMinimal, "    windows: [1h]\n")[0] + "groups: {name: x}\n", "t.yaml:11: groups: want a list, got a mapping"},
		{"groups empty", strings.SplitAfter(groupsMinimal, "    windows: [1h]\n")[0] + "groups: []\n", "t.yaml:11: groups: empty; leave groups out"},
		{"nine groups", groupN(9), "t.yaml:12: groups: 9 groups, at most 8 are supported"},
		{"group not a mapping", strings.SplitAfter(groupsMinimal, "groups:\n")[0] + "  - device\n", "t.yaml:12: groups[0]: want a mapping, got \"device\""},
		{"group unknown key", rep("    key: device_id\n", "    key: device_id\n    entity_id: x\n"), "t.yaml:14: groups[0].entity_id: unknown key; allowed here: name, key, windows, features"},
		{"group duplicate key", rep("    key: device_id\n", "    key: device_id\n    key: ip\n"), "t.yaml:14: groups[0].key: duplicate key (first at line 13)"},
		{"group without name", rep("  - name: device\n    key", "  - key"), "t.yaml:12: groups[0].name: missing"},
		{"group without key", rep("    key: device_id\n", ""), "t.yaml:12: groups[0].key: missing"},
		{"group without windows", rep("    windows: [5m:5s]\n", ""), "t.yaml:12: groups[0].windows: missing"},
		{"group without features", strings.SplitAfter(groupsMinimal, "    windows: [5m:5s]\n")[0], "t.yaml:12: groups[0].features: missing"},
		{"group name uppercase", rep("name: device", "name: Device"), `t.yaml:12: groups[0].name: "Device" is not a group name`},
		{"group name digit first", rep("name: device", "name: 1device"), `t.yaml:12: groups[0].name: "1device" is not a group name`},
		{"group name dash", rep("name: device", "name: dev-ice"), `t.yaml:12: groups[0].name: "dev-ice" is not a group name`},
		{"group name 33 bytes", rep("name: device", "name: d"+strings.Repeat("x", 32)), "groups[0].name: \"d" + strings.Repeat("x", 32) + "\" is not a group name"},
		{"group name null", rep("name: device", "name: ~"), "t.yaml:12: groups[0].name: want a value, got null"},
		{"top group name bad", "group: Card\n" + groupsMinimal, `t.yaml:1: group: "Card" is not a group name`},
		{"top group name list", "group: [a]\n" + groupsMinimal, "t.yaml:1: group: want a value, got a list"},
		{"name is the default in-place name", rep("name: device", "name: entity"), "t.yaml:12: groups[0].name: entity is the in-place group's name (the default of group:)"},
		{"name is the in-place name", "group: device\n" + groupsMinimal, "t.yaml:13: groups[0].name: device is the in-place group's name (group: at line 1)"},
		{"name twice", groupsMinimal + "  - {name: device, key: ip, windows: [1m:1s], features: [{name: n, agg: count, windows: [1m]}]}\n",
			"t.yaml:17: groups[1].name: group device already declared at line 12"},
		{"key is the entity", rep("key: device_id", "key: card.id"), "t.yaml:13: groups[0].key: card.id is input.entity_id"},
		{"key twice", groupsMinimal + "  - {name: ip, key: device_id, windows: [1m:1s], features: [{name: n, agg: count, windows: [1m]}]}\n",
			"t.yaml:17: groups[1].key: device_id is already the key of groups[0]"},
		{"key not a path", rep("key: device_id", "key: device..id"), `t.yaml:13: groups[0].key: "device..id" is not a dot path`},
		{"key too deep", rep("key: device_id", "key: "+strings.Repeat("a.", 16)+"b"), "t.yaml:13: groups[0].key: path \"" + strings.Repeat("a.", 16) + "b\" is 17 fields deep"},
		{"key a mapping", rep("key: device_id", "key: {a: b}"), "t.yaml:13: groups[0].key: want a value, got a mapping"},
		{"key alias", "x0: &k device_id\n" + groupsMinimal, "t.yaml:1: x0: unknown key"},
		{"key anchor", rep("key: device_id", "key: &k device_id"), "t.yaml:13: groups[0].key: anchors and aliases are not supported"},
		{"group windows empty", rep("[5m:5s]", "[]"), "t.yaml:14: groups[0].windows: empty"},
		{"group windows not a list", rep("[5m:5s]", "5m:5s"), `t.yaml:14: groups[0].windows: want a list, got "5m:5s"`},
		{"group window syntax", rep("[5m:5s]", "[5m]"), `t.yaml:14: groups[0].windows[0]: window spec "5m": want W:b`},
		{"group window twice", rep("[5m:5s]", "[5m:5s, 300s:1s]"), "t.yaml:14: groups[0].windows[1]: window length 5m already given at line 14"},
		{"group window comma", rep("[5m:5s]", `["5m:5s,1h:1m"]`), "t.yaml:14: groups[0].windows[0]: one W:b per list entry"},
		{"group 65 windows", rep("[5m:5s]", "["+strings.TrimSuffix(strings.Repeat("1s:1s, ", 65), ", ")+"]"), "t.yaml:14: groups[0].windows: 65 windows, at most 64"},
		{"group features empty", strings.SplitAfter(groupsMinimal, "    windows: [5m:5s]\n")[0] + "    features: []\n", "t.yaml:15: groups[0].features: empty; declare at least one feature"},
		{"group feature top window", rep("windows: [5m]}", "windows: [1h]}"), `t.yaml:16: groups[0].features[0].windows[0]: no window "1h" in groups[0].windows (5m)`},
		{"group feature window twice", rep("windows: [5m]}", "windows: [5m, 5m]}"), "t.yaml:16: groups[0].features[0].windows[1]: window 5m listed twice"},
		{"group feature name twice", addGroupFeature("{name: n, agg: count, windows: [5m]}"), "t.yaml:17: groups[0].features[1].name: feature n already declared at line 16"},
		{"group feature bad name", rep("{name: n,", "{name: 1n,"), `t.yaml:16: groups[0].features[0].name: "1n" is not a valid name`},
		{"group feature unknown key", rep("windows: [5m]}", "windows: [5m], by: x}"), "t.yaml:16: groups[0].features[0].by: unknown key"},
		{"group feature missing windows", addGroupFeature("{name: m, agg: count}"), "t.yaml:17: groups[0].features[1].windows: missing"},
		{"group feature third missing windows", addGroupFeature("{name: m, agg: count, windows: [5m]}") + "      - {name: o, agg: count}\n", "t.yaml:18: groups[0].features[2].windows: missing"},
		{"group feature bad agg", rep("agg: count, windows: [5m]", "agg: mean, windows: [5m]"), `t.yaml:16: groups[0].features[0].agg: "mean" is not an aggregate`},
		{"group sum without amount", strings.Replace(rep("agg: count, windows: [5m]", "agg: sum, windows: [5m]"), "  amount: amt\n", "", 1), "t.yaml:15: groups[0].features[0].agg: sum is over the amount, and input.amount is not mapped"},
		{"group distinct without field", addGroupFeature("{name: d, agg: distinct_count, windows: [5m]}"), "t.yaml:17: groups[0].features[1].field: missing"},
		{"group count with field", addGroupFeature("{name: d, agg: count, field: x, windows: [5m]}"), "t.yaml:17: groups[0].features[1].field: only distinct_count takes a field"},
		{"group max_exact range", addGroupFeature("{name: d, agg: distinct_count, field: x, max_exact: 4097, windows: [5m]}"), "t.yaml:17: groups[0].features[1].max_exact: 4097 is not a whole number in 1..4096"},
		{"group where empty", addGroupFeature("{name: f, agg: count, windows: [5m], where: []}"), "t.yaml:17: groups[0].features[1].where: empty"},
		{"group predicate without op", addGroupFeature("{name: f, agg: count, windows: [5m], where: [{field: s}]}"), "t.yaml:17: groups[0].features[1].where[0]: no comparison"},
		{"group predicate null constant", addGroupFeature("{name: f, agg: count, windows: [5m], where: [{field: s, eq: ~}]}"), "t.yaml:17: groups[0].features[1].where[0].eq: want a constant, got null"},
		{"second group's error", groupsMinimal + "  - {name: ip, key: ip, windows: [1m:1s], features: [{name: n, agg: count, windows: [5m]}]}\n",
			`t.yaml:17: groups[1].features[0].windows[0]: no window "5m" in groups[1].windows (1m)`},
		{"33 filters in a group", manyFeatures(33, func(i int) string {
			return fmt.Sprintf("{name: f%d, agg: count, windows: [5m], where: [{field: s, eq: v%d}]}", i, i)
		}), "groups[0].features[33].where: more than 32 different filters in one group (groups[0])"},
		{"33 distincts in a group", manyFeatures(33, func(i int) string {
			return fmt.Sprintf("{name: d%d, agg: distinct_count, field: f%d, windows: [5m]}", i, i)
		}), "groups[0].features[33].field: more than 32 distinct fields in one group (groups[0])"},
		{"257 features in a group", manyFeatures(256, func(i int) string {
			return fmt.Sprintf("{name: c%d, agg: count, windows: [5m]}", i)
		}), "t.yaml:16: groups[0].features: 257 features, at most 256 are supported"},
		{"65 fields over all groups", manyFeatures(30, func(i int) string {
			return fmt.Sprintf("{name: d%d, agg: distinct_count, field: a%d, windows: [5m]}", i, i)
		}) + "  - name: ip\n    key: ip\n    windows: [1m:1s]\n    features:\n" + func() string {
			var b strings.Builder
			for i := 0; i < 30; i++ {
				fmt.Fprintf(&b, "      - {name: d%d, agg: distinct_count, field: b%d, windows: [1m]}\n", i, i)
			}
			return b.String()
		}(), "t.yaml:12: groups: the definition reads 66 fields per record (all groups together), more than 64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("parsed; want an error containing %q\n%s", tc.want, tc.src)
			}
			var de *Error
			if !errors.As(err, &de) || de.File != "t.yaml" || de.Line == 0 {
				t.Fatalf("error %v (%T) is not a located *Error", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error\n  %v\nwant it to contain\n  %s", err, tc.want)
			}
		})
	}
	// The limits are per group: 8 groups, 32 filters and 32 distinct fields
	// in a group beside 32 of each in the in-place group, all parse.
	if _, err := Parse("t.yaml", []byte(groupN(8))); err != nil {
		t.Errorf("8 groups: %v", err)
	}
	var b strings.Builder
	b.WriteString(strings.SplitAfter(groupsMinimal, "groups:\n")[0][:strings.Index(groupsMinimal, "groups:\n")])
	for i := 0; i < 32; i++ {
		fmt.Fprintf(&b, "  - {name: f%d, agg: count, windows: [1h], where: [{field: s, eq: v%d}]}\n", i, i)
	}
	b.WriteString("groups:\n  - name: device\n    key: device_id\n    windows: [5m:5s]\n    features:\n")
	for i := 0; i < 32; i++ {
		fmt.Fprintf(&b, "      - {name: f%d, agg: count, windows: [5m], where: [{field: s, eq: w%d}]}\n", i, i)
	}
	d, err := Parse("t.yaml", []byte(b.String()))
	if err != nil {
		t.Fatalf("32 filters in each of two groups: %v", err)
	}
	if len(d.Filters) != 32 || len(d.Groups[0].Filters) != 32 || d.Groups[0].Features[31].Filter != 31 {
		t.Fatalf("filters %d and %d", len(d.Filters), len(d.Groups[0].Filters))
	}
}

// The hash covers the groups and the group names; a definition without
// groups keeps the hash it had before groups existed.
func TestGroupsHash(t *testing.T) {
	// Recorded from the example before groups were added to the format.
	ex, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got := ex.Hash(); got != "fecac38999c8806d" {
		t.Fatalf("card_features.yaml hashes %s; it must keep fecac38999c8806d", got)
	}
	if got := mustParse(t, "m.yaml", minimal).Hash(); got != "81379224c8b5e62b" {
		t.Fatalf("minimal hashes %s; it must keep 81379224c8b5e62b", got)
	}
	a := mustParse(t, "a.yaml", groupsMinimal)
	noGroups := mustParse(t, "n.yaml", strings.SplitAfter(groupsMinimal, "    windows: [1h]\n")[0])
	if a.Hash() == noGroups.Hash() {
		t.Fatal("adding a group keeps the hash")
	}
	// Same meaning, other layout: the same hash.
	flow := `{"groups": [{"features": [{"windows": ["5m"], "agg": "count", "name": "n"}], "windows": ["5m:5s"], "key": "device_id", "name": "device"}],
 "features": [{"name": "n", "agg": "count", "windows": ["1h"]}], "windows": ["1h:1m"],
 "input": {"amount": "amt", "event_time": "ts", "entity_id": "card.id", "event_id": "id"}}`
	if b := mustParse(t, "b.json", flow); b.Hash() != a.Hash() {
		t.Fatalf("the same groups in JSON hash %s, YAML %s", b.Hash(), a.Hash())
	}
	if b := mustParse(t, "b.yaml", "group: entity\n"+groupsMinimal); b.Hash() != a.Hash() {
		t.Fatal("group: entity is the default, yet changes the hash")
	}
	for _, change := range []struct{ from, to string }{
		{"groups:\n", "group: card\ngroups:\n"},
		{"name: device", "name: dev"},
		{"key: device_id", "key: ip"},
		{"[5m:5s]", "[5m:1s]"},
		{"[5m:5s]", "[5m:5s, 1h:1m]"},
		{"{name: n, agg: count, windows: [5m]}", "{name: m, agg: count, windows: [5m]}"},
		{"{name: n, agg: count, windows: [5m]}", "{name: n, agg: count, windows: [5m], where: [{field: s, eq: A}]}"},
		{"{name: n, agg: count, windows: [5m]}", "{name: n, agg: distinct_count, field: card.id, windows: [5m]}"},
		{"{name: n, agg: count, windows: [5m]}", "{name: n, agg: count, windows: [5m]}\n  - {name: ip, key: ip, windows: [5m:5s], features: [{name: n, agg: count, windows: [5m]}]}"},
	} {
		if !strings.Contains(groupsMinimal, change.from) {
			t.Fatalf("no %q", change.from)
		}
		c := mustParse(t, "c.yaml", strings.Replace(groupsMinimal, change.from, change.to, 1))
		if c.Hash() == a.Hash() {
			t.Errorf("changing %q to %q keeps hash %s", change.from, change.to, a.Hash())
		}
	}
	// The order of groups is the order of codec.Transaction.Groups.
	two := groupsMinimal + "  - {name: ip, key: ip, windows: [5m:5s], features: [{name: n, agg: count, windows: [5m]}]}\n"
	swapped := strings.SplitAfter(groupsMinimal, "groups:\n")[0] + "  - {name: ip, key: ip, windows: [5m:5s], features: [{name: n, agg: count, windows: [5m]}]}\n" +
		strings.SplitAfter(groupsMinimal, "groups:\n")[1]
	if mustParse(t, "x.yaml", two).Hash() == mustParse(t, "y.yaml", swapped).Hash() {
		t.Error("swapping two groups keeps the hash")
	}
}

// The groups example in docs/features.md is the example file: the same hash
// and the same specs, group for group.
func TestDocsGroupsExample(t *testing.T) {
	doc, err := os.ReadFile("../../docs/features.md")
	if err != nil {
		t.Fatal(err)
	}
	const fence = "```yaml payment_groups.yaml\n"
	i := strings.Index(string(doc), fence)
	if i < 0 {
		t.Fatal("docs/features.md has no " + strings.TrimSpace(fence) + " block")
	}
	rest := string(doc)[i+len(fence):]
	inDoc := mustParse(t, "features.md", rest[:strings.Index(rest, "```")])
	file := paymentDef(t)
	if inDoc.Hash() != file.Hash() || !reflect.DeepEqual(inDoc.Spec(), file.Spec()) || inDoc.Group != file.Group || len(inDoc.Groups) != len(file.Groups) {
		t.Fatal("the groups example in docs/features.md differs from examples/features/payment_groups.yaml")
	}
	for k := range file.Groups {
		a, b := &inDoc.Groups[k], &file.Groups[k]
		if a.Name != b.Name || a.Key != b.Key || !reflect.DeepEqual(a.Spec(), b.Spec()) {
			t.Fatalf("group %d differs: %s/%s", k, a.Name, b.Name)
		}
	}
}
