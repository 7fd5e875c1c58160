package definition

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// schemaGen builds random record schemas in which the mapped fields sit at
// random depths behind records and nullable unions, among fields of every
// type to be skipped, and a definition over them. It exists to find shapes
// of schema the hand-written wide schema does not have.
type schemaGen struct {
	r     *rand.Rand
	names int
	// leaves found so far, by what they can be used for: path → type class
	leaves []leafInfo
}

type leafInfo struct {
	path  string
	class string // "string", "enum:A|B", "bool", "int", "long", "double", "float", "bytes", "fixed", "dec:<scale>"
}

func (g *schemaGen) name(prefix string) string {
	g.names++
	return fmt.Sprintf("%s%d", prefix, g.names)
}

// skipType is any Avro type, for fields nobody maps.
func (g *schemaGen) skipType(depth int) string {
	k := g.r.IntN(14)
	if depth > 2 {
		k = g.r.IntN(8)
	}
	switch k {
	case 0:
		return `"null"`
	case 1:
		return `"boolean"`
	case 2:
		return `"int"`
	case 3:
		return `"long"`
	case 4:
		return `"float"`
	case 5:
		return `"double"`
	case 6:
		return `"bytes"`
	case 7:
		return `"string"`
	case 8:
		return fmt.Sprintf(`{"type":"enum","name":"%s","symbols":["P","Q","R"]}`, g.name("E"))
	case 9:
		return fmt.Sprintf(`{"type":"fixed","name":"%s","size":%d}`, g.name("F"), 1+g.r.IntN(4))
	case 10:
		return fmt.Sprintf(`{"type":"array","items":%s}`, g.skipType(depth+1))
	case 11:
		return fmt.Sprintf(`{"type":"map","values":%s}`, g.skipType(depth+1))
	case 12:
		return fmt.Sprintf(`["null",{"type":"array","items":%s},"string","int"]`, g.skipType(depth+1))
	default:
		var fields []string
		for i := g.r.IntN(3); i > 0; i-- {
			fields = append(fields, fmt.Sprintf(`{"name":"s%d","type":%s}`, i, g.skipType(depth+1)))
		}
		return fmt.Sprintf(`{"type":"record","name":"%s","fields":[%s]}`, g.name("S"), strings.Join(fields, ","))
	}
}

// leafType is a mappable type and its class.
func (g *schemaGen) leafType() (string, string) {
	switch g.r.IntN(11) {
	case 0:
		return `"string"`, "string"
	case 1:
		return fmt.Sprintf(`{"type":"enum","name":"%s","symbols":["A","B","C"]}`, g.name("K")), "enum"
	case 2:
		return `"boolean"`, "bool"
	case 3:
		return `"int"`, "int"
	case 4:
		return `"long"`, "long"
	case 5:
		return `"double"`, "double"
	case 6:
		return `"float"`, "float"
	case 7:
		return `"bytes"`, "bytes"
	case 8:
		return fmt.Sprintf(`{"type":"fixed","name":"%s","size":3}`, g.name("X")), "fixed"
	case 9:
		s := g.r.IntN(4)
		return fmt.Sprintf(`{"type":"bytes","logicalType":"decimal","precision":12,"scale":%d}`, s), fmt.Sprintf("dec:%d", s)
	default:
		return `"string"`, "string"
	}
}

func (g *schemaGen) maybeNull(t string) string {
	switch g.r.IntN(4) {
	case 0:
		return `["null",` + t + `]`
	case 1:
		return `[` + t + `,"null"]`
	}
	return t
}

// record builds a record whose fields mix skipped fields, leaves, nested
// records and the required fields assigned to it.
func (g *schemaGen) record(prefix string, depth int, required map[string]string) string {
	var fields []string
	add := func(name, typ string) {
		fields = append(fields, fmt.Sprintf(`{"name":"%s","type":%s}`, name, typ))
	}
	for name, typ := range required {
		add(name, typ)
	}
	for i := 0; i < 2+g.r.IntN(4); i++ {
		name := fmt.Sprintf("f%d", i)
		path := strings.TrimPrefix(prefix+"."+name, ".")
		switch g.r.IntN(4) {
		case 0:
			add(name, g.skipType(0))
		case 1, 2:
			t, class := g.leafType()
			add(name, g.maybeNull(t))
			g.leaves = append(g.leaves, leafInfo{path, class})
		default:
			if depth < 3 {
				add(name, g.maybeNull(g.record(path, depth+1, nil)))
			}
		}
	}
	g.r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	return fmt.Sprintf(`{"type":"record","name":"%s","fields":[%s]}`, g.name("R"), strings.Join(fields, ","))
}

var classConsts = map[string][]string{
	"string": {"x", "card-1", "é", "5411", "A"},
	"enum":   {"A", "B", "C"},
	"bool":   {"true", "false"},
	"int":    {"0", "1", "2", "5.5", "-1", "2147483647"},
	"long":   {"0", "7", "999.5", "1e3", "-9223372036854775808"},
	"double": {"0.1", "0.5", "-2.5", "1e300", "12.345"},
	"float":  {"0.1", "0.29", "100.125"},
}

func (g *schemaGen) definition() (string, string) {
	eid, eclass := []string{`"string"`, `"long"`, `"bytes"`}[g.r.IntN(3)], ""
	_ = eclass
	timeT := []string{`"long"`, `{"type":"long","logicalType":"timestamp-millis"}`, `{"type":"long","logicalType":"timestamp-micros"}`}[g.r.IntN(3)]
	amtT, amtIn := []string{`"long"`, `"int"`, `{"type":"bytes","logicalType":"decimal","precision":18,"scale":2}`, `"double"`}[g.r.IntN(4)], ""
	switch {
	case strings.Contains(amtT, "decimal"):
		amtIn = ", amount_exponent: " + fmt.Sprint(g.r.IntN(4))
	case amtT == `"double"`:
		amtIn = ", amount_exponent: 2, double_rounding: half_even"
	}
	// The required fields go into the top record or one nested record.
	nested := map[string]string{"key": g.maybeNull(`"string"`), "amt": g.maybeNull(amtT)}
	top := map[string]string{"eid": g.maybeNull(eid), "t": timeT,
		"sub": g.maybeNull(g.record("sub", 1, nested))}
	// A namespace, so that goavro's union keys for named types contain a dot
	// and the reference tells them from field names.
	schema := strings.Replace(g.record("", 0, top), `{"type":"record",`, `{"type":"record","namespace":"r",`, 1)
	feats := g.features()
	def := fmt.Sprintf("input: {event_id: eid, entity_id: sub.key, event_time: t, amount: sub.amt%s}\nwindows: [1m:1s]\nfeatures:\n%s\n",
		amtIn, strings.Join(feats, "\n"))
	return schema, def
}

// features is a feature list over the leaves found so far (at most 12), each
// a count filtered on a leaf or a distinct count of one, over window 1m.
func (g *schemaGen) features() []string {
	var feats []string
	feats = append(feats, "  - {name: n, agg: count, windows: [1m]}")
	r := g.r
	for i, lf := range g.leaves {
		if i >= 12 {
			break
		}
		class := lf.class
		if strings.HasPrefix(class, "dec:") {
			feats = append(feats, fmt.Sprintf("  - {name: q%d, agg: count, windows: [1m], where: [{field: %s, %s: %s}]}", i, lf.path,
				[]string{"lt", "ge", "eq", "ne"}[r.IntN(4)], []string{"0.5", "1.23", "100", "-3.125"}[r.IntN(4)]))
			continue
		}
		switch {
		case class == "bytes" || class == "fixed" || (r.IntN(3) == 0 && class != "double" && class != "float"):
			feats = append(feats, fmt.Sprintf("  - {name: d%d, agg: distinct_count, field: %s, windows: [1m]}", i, lf.path))
		case r.IntN(5) == 0:
			feats = append(feats, fmt.Sprintf("  - {name: z%d, agg: count, windows: [1m], where: [{field: %s, is_null: %v}]}", i, lf.path, r.IntN(2) == 0))
		default:
			consts := classConsts[class]
			c := consts[r.IntN(len(consts))]
			var ops []string
			switch class {
			case "string", "enum":
				ops = []string{"eq", "ne", "in", "not_in"}
			case "bool":
				ops = []string{"eq", "ne"}
			case "int", "long":
				ops = []string{"eq", "ne", "lt", "le", "gt", "ge", "in"}
			default:
				ops = []string{"eq", "ne", "lt", "le", "gt", "ge"}
			}
			op := ops[r.IntN(len(ops))]
			val := c
			if op == "in" || op == "not_in" {
				if (class == "int" || class == "long") && strings.ContainsAny(c, ".e") {
					c = "1"
				}
				val = "[" + c + ", " + consts[r.IntN(len(consts))] + "]"
				if class == "int" || class == "long" {
					val = "[" + c + "]"
				}
			}
			if class == "string" {
				val = strings.ReplaceAll(val, "é", `"é"`)
			}
			feats = append(feats, fmt.Sprintf("  - {name: p%d, agg: count, windows: [1m], where: [{field: %s, %s: %s}]}", i, lf.path, op, val))
		}
	}
	return feats
}

// groups adds up to three re-keyed groups to def, each keyed by a string,
// bytes, int or long leaf (nullable or not) and with features of its own,
// and returns it with, per group, the one-group definition that computes the
// group alone with its key as entity_id.
func (g *schemaGen) groups(def string) (string, []string) {
	var keys []string
	for _, lf := range g.leaves {
		switch lf.class {
		case "string", "bytes", "int", "long":
			keys = append(keys, lf.path)
		}
	}
	g.r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	keys = keys[:min(len(keys), 1+g.r.IntN(3))]
	if len(keys) == 0 {
		return def, nil
	}
	input := def[:strings.IndexByte(def, '\n')+1]
	var b strings.Builder
	b.WriteString(def + "groups:\n")
	var ones []string
	for i, key := range keys {
		feats := strings.Join(g.features(), "\n")
		fmt.Fprintf(&b, "  - name: g%d\n    key: %s\n    windows: [1m:1s]\n    features:\n%s\n", i, key,
			strings.ReplaceAll(feats, "  - {", "      - {"))
		ones = append(ones, strings.Replace(input, "entity_id: sub.key", "entity_id: "+key, 1)+"windows: [1m:1s]\nfeatures:\n"+feats+"\n")
	}
	return b.String(), ones
}

// TestGroupsRandomSchemas: over random schemas, every group's key and words
// are what goavro's reading gives (the reference) and what a one-group
// definition of the group's features, keyed in place by the group's key,
// computes for the same record.
func TestGroupsRandomSchemas(t *testing.T) {
	n := 120
	if testing.Short() || raceEnabled {
		n = 30
	}
	seen := map[string]int{}
	withGroups := 0
	for s := 0; s < n; s++ {
		g := &schemaGen{r: rand.New(rand.NewPCG(uint64(s), 27))}
		schema, plain := g.definition()
		defSrc, oneSrcs := g.groups(plain)
		if len(oneSrcs) == 0 {
			continue
		}
		withGroups++
		d, err := Parse("rand.yaml", []byte(defSrc))
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", s, err, defSrc)
		}
		c, err := Compile(d, schema, limitsForTest)
		if err != nil {
			t.Fatalf("seed %d: %v\nschema %s\n%s", s, err, schema, defSrc)
		}
		var ones []codec.Decoder
		for _, src := range oneSrcs {
			one, err := Compile(mustParse(t, "one.yaml", src), schema, limitsForTest)
			if err != nil {
				t.Fatalf("seed %d: %v\n%s", s, err, src)
			}
			ones = append(ones, one.Decoder())
		}
		ref := newRef(d, schema)
		root, gc, err := parseSchema(schema)
		if err != nil {
			t.Fatal(err)
		}
		vg := &gen{r: rand.New(rand.NewPCG(uint64(s), 28))}
		for i := 0; i < 150; i++ {
			value, err := gc.BinaryFromNative(nil, vg.value(root, 0))
			if err != nil {
				t.Fatalf("seed %d: goavro cannot encode: %v", s, err)
			}
			t.Run("", func(t *testing.T) {
				checkSame(t, c.Decoder(), ref, value, 0, false)
				checkGroupsAgree(t, d, c.Decoder(), ones, value, seen)
				bad := mutate(vg.r, value)
				checkSame(t, c.Decoder(), ref, bad, 0, false)
				checkGroupsAgree(t, d, c.Decoder(), ones, bad, seen)
			})
			if t.Failed() {
				t.Fatalf("seed %d record %d\nschema %s\n%s", s, i, schema, defSrc)
			}
		}
	}
	t.Logf("%d of %d schemas with groups; cases %v", withGroups, n, seen)
	if withGroups < n/2 {
		t.Errorf("only %d of %d random schemas have a key for a group", withGroups, n)
	}
	for _, k := range []string{"decode", "bad key", "in-place rule", "no key", "key"} {
		if seen[k] < 50 {
			t.Errorf("case %q met %d times; the generator does not reach it", k, seen[k])
		}
	}
}

func TestDifferentialRandomSchemas(t *testing.T) {
	n := 150
	if testing.Short() || raceEnabled {
		n = 40
	}
	for s := 0; s < n; s++ {
		g := &schemaGen{r: rand.New(rand.NewPCG(uint64(s), 7))}
		schema, defSrc := g.definition()
		d, err := Parse("rand.yaml", []byte(defSrc))
		if err != nil {
			t.Fatalf("seed %d: %v\n%s", s, err, defSrc)
		}
		c, err := Compile(d, schema, limitsForTest)
		if err != nil {
			t.Fatalf("seed %d: %v\nschema %s\n%s", s, err, schema, defSrc)
		}
		ref := newRef(d, schema)
		root, gc, err := parseSchema(schema)
		if err != nil {
			t.Fatal(err)
		}
		vg := &gen{r: rand.New(rand.NewPCG(uint64(s), 8))}
		for i := 0; i < 200; i++ {
			native := vg.value(root, 0)
			value, err := gc.BinaryFromNative(nil, native)
			if err != nil {
				t.Fatalf("seed %d: goavro cannot encode %v: %v", s, native, err)
			}
			t.Run("", func(t *testing.T) {
				checkSame(t, c.Decoder(), ref, value, 0, false)
				checkSame(t, c.Decoder(), ref, mutate(vg.r, value), 0, false)
			})
			if t.Failed() {
				t.Fatalf("seed %d record %d\nschema %s\n%s", s, i, schema, defSrc)
			}
		}
	}
}
