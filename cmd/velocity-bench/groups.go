package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// The groups benchmark (issue 27): one payments stream (payments.go), features for 1,
// 2 or 3 key dimensions of it. Ours runs a definition of that many groups
// (`run --features`); the Kafka Streams peer (bench/kstreams, VelocityGroups.java)
// computes the same groups with the same windows and features and writes the same
// flat rows. benchGroups is the one description both are held to: the definitions are
// generated from it, the outputs of both sides are decoded with the feature.Spec it
// gives (feature.ParseRow, which refuses a row of any other shape), and the Java
// side's constants mirror it (a change here that Java does not follow shows up as bad
// values in every peer run).

// benchGroup is one key dimension: its name (the output topic's suffix for a
// re-keyed group), its key path in payment_event.avsc, and its windows. Every group
// has two features, attempts (count) and spend (sum of the amount), over all its
// windows in order; DistinctCards adds distinct_cards (distinct_count of card.id,
// default max_exact 64) over its last window.
type benchGroup struct {
	Name          string
	Key           string
	Windows       []string // W:b, in output order
	DistinctCards bool
}

// benchGroups: [0] is the in-place group (the input is keyed by card id), then the
// re-keyed ones in definition order. A run with n groups computes benchGroups[:n].
var benchGroups = []benchGroup{
	{Name: "card", Key: "card.id", Windows: []string{"1m:1s", "1h:1m", "24h:1h"}},
	{Name: "device", Key: "device_id", Windows: []string{"5m:5s", "24h:1h"}, DistinctCards: true},
	{Name: "ip", Key: "ip", Windows: []string{"5m:5s", "1h:1m"}},
}

// MaxBenchGroups is the largest groups=N a processor spec takes.
var MaxBenchGroups = len(benchGroups)

// windowName is the name a definition gives the window "W:b": W as written.
func windowName(w string) string { n, _, _ := strings.Cut(w, ":"); return n }

// featuresYAML is g's windows and features as a definition writes them, each line
// prefixed with indent.
func (g benchGroup) featuresYAML(indent string) string {
	var names []string
	for _, w := range g.Windows {
		names = append(names, windowName(w))
	}
	all := strings.Join(names, ", ")
	var b strings.Builder
	fmt.Fprintf(&b, "%swindows: [%s]\n", indent, strings.Join(g.Windows, ", "))
	fmt.Fprintf(&b, "%sfeatures:\n", indent)
	fmt.Fprintf(&b, "%s  - {name: attempts, agg: count, windows: [%s]}\n", indent, all)
	fmt.Fprintf(&b, "%s  - {name: spend, agg: sum, windows: [%s]}\n", indent, all)
	if g.DistinctCards {
		fmt.Fprintf(&b, "%s  - {name: distinct_cards, agg: distinct_count, field: card.id, windows: [%s]}\n", indent, names[len(names)-1])
	}
	return b.String()
}

// inputYAML is the input mapping of payment_event.avsc with entity_id = key.
func inputYAML(key string) string {
	return fmt.Sprintf(`input:
  schema: payment_event.avsc
  event_id: txn_id
  entity_id: %s
  event_time: ts
  amount: amount
  amount_exponent: 2
`, key)
}

// GroupsDefinition is the definition file ours runs for n groups (1..MaxBenchGroups):
// benchGroups[0] in place, then the re-keyed groups under `groups:`. With n = 1 it has
// neither `group:` nor `groups:`, so that a build without re-keyed groups runs it.
func GroupsDefinition(n int) (string, error) {
	if n < 1 || n > len(benchGroups) {
		return "", fmt.Errorf("groups=%d: want 1..%d", n, len(benchGroups))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# velocity-bench: %d group(s) over payment_event.avsc, generated from benchGroups (groups.go).\n", n)
	fmt.Fprintf(&b, "version: bench-payments-groups-%d\n", n)
	if n > 1 {
		fmt.Fprintf(&b, "group: %s\n", benchGroups[0].Name)
	}
	b.WriteString(inputYAML(benchGroups[0].Key))
	b.WriteString(benchGroups[0].featuresYAML(""))
	if n > 1 {
		b.WriteString("groups:\n")
		for _, g := range benchGroups[1:n] {
			fmt.Fprintf(&b, "  - name: %s\n    key: %s\n", g.Name, g.Key)
			b.WriteString(g.featuresYAML("    "))
		}
	}
	return b.String(), nil
}

// GroupSpec is the engine spec of one group's output rows: that of a one-group
// definition with the group's key, windows and features, which is what a re-keyed
// group's rows are (feature.AvroSchema(GroupSpec.Spec) with entity_id = the group's
// key).
func GroupSpec(g benchGroup) (*feature.Spec, error) {
	src := inputYAML(g.Key) + g.featuresYAML("")
	d, err := definition.Parse("bench-"+g.Name+".yaml", []byte(src))
	if err != nil {
		return nil, err
	}
	return definition.EngineSpec(d)
}

// GroupTopics are the output topics of n groups for output topic out: the in-place
// group's is out itself, a re-keyed group g's is out.g (ours' default --group-topic
// {output}.{group}, and the Kafka Streams peer's).
func GroupTopics(out string, n int) []string {
	topics := []string{out}
	for _, g := range benchGroups[1:n] {
		topics = append(topics, out+"."+g.Name)
	}
	return topics
}

// ourRepartitionPrefix is the start of the names of ours' repartition topics for
// consumer group group (__velocity-repartition-<group>-<g>), for the cleanup.
func ourRepartitionPrefix(group string) string { return "__velocity-repartition-" + group + "-" }

// writeGroupsDefinition writes the n-group definition and the schema it names into
// dir and returns the definition's path.
func writeGroupsDefinition(dir string, n int) (string, error) {
	def, err := GroupsDefinition(n)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "payment_event.avsc"), []byte(paymentEventSchema), 0o644); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fmt.Sprintf("groups%d.yaml", n))
	return path, os.WriteFile(path, []byte(def), 0o644)
}
