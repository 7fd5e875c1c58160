// Package deploy holds the operational files that ship beside the binary, and what
// their tests share: the Prometheus alert rules (alerts.yml, unit-tested by
// alerts_test.yml), the Grafana dashboard (grafana/dashboards), the Kubernetes
// manifests (kubernetes/) and the compose file's Prometheus configuration.
//
// Nothing here is used by the service itself. deploy_test.go checks the files with
// the real tools (promtool, kubectl kustomize, kubernetes-validate) and against the
// metrics pkg/metrics registers; integration/prometheus_test.go has a real Prometheus
// server scrape a running instance with the rules loaded.
package deploy

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PendingMetrics are metrics that the rules and the dashboard use but that have no
// series yet (none now). Tests accept their absence, and only theirs (and
// EventMetrics'). integration/prometheus_test.go fails on a name listed here that a
// running instance exports, so remove each name once it has series.
var PendingMetrics = []string{}

// EventMetrics are labelled counters whose series appear only once what they count
// has happened, which the scrape test's healthy run does not cause: input offsets
// deleted by retention before they were processed. Their rules are unit-tested by
// promtool (alerts_test.yml) instead.
var EventMetrics = []string{
	"velocity_input_offsets_skipped_total",
	// Ids the --max-dedupe-ids cap (off by default) made a partition forget.
	"velocity_dedupe_ids_evicted_total",
}

// IsPending reports whether name is in PendingMetrics.
func IsPending(name string) bool { return slices.Contains(PendingMetrics, name) }

// AlertRules is alerts.yml.
//
//go:embed alerts.yml
var AlertRules []byte

// Dashboard is the Grafana dashboard JSON.
//
//go:embed grafana/dashboards/velocity-consumer.json
var Dashboard []byte

// Rule is one rule of alerts.yml.
type Rule struct {
	Group  string
	Alert  string // empty for a recording rule
	Record string
	Expr   string
}

// Name is the alert's or the recording rule's name.
func (r Rule) Name() string {
	if r.Alert != "" {
		return r.Alert
	}
	return r.Record
}

// Rules parses alerts.yml.
func Rules() ([]Rule, error) {
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(AlertRules, &f); err != nil {
		return nil, fmt.Errorf("alerts.yml: %w", err)
	}
	var out []Rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, Rule{Group: g.Name, Alert: r.Alert, Record: r.Record, Expr: strings.TrimSpace(r.Expr)})
		}
	}
	return out, nil
}

// Query is one query of the dashboard.
type Query struct {
	Panel string
	Expr  string
}

// DashboardQueries returns every target expression of the dashboard's panels, and the
// template variables' queries.
func DashboardQueries() ([]Query, error) {
	var d struct {
		Panels     []dashPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(Dashboard, &d); err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	var out []Query
	var walk func([]dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out = append(out, Query{Panel: p.Title, Expr: t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			var s string
			if err := json.Unmarshal(v.Query, &s); err != nil {
				return nil, fmt.Errorf("dashboard variable %s: %w", v.Name, err)
			}
			q.Query = s
		}
		out = append(out, Query{Panel: "variable " + v.Name, Expr: q.Query})
	}
	return out, nil
}

type dashPanel struct {
	Title   string `json:"title"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashPanel `json:"panels"`
}

// metricRE finds the metric names an expression selects: the exporters' prefixes
// (ours, and the Go and process collectors' that pkg/metrics registers) and up.
var metricRE = regexp.MustCompile(`\b(?:velocity_|go_|process_)[a-zA-Z0-9_]*[a-zA-Z0-9]\b|\bup\b`)

// MetricNames returns the metric names expr selects, sorted, without repeats. Label
// names never carry those prefixes here, so a name in braces is not mistaken for one.
func MetricNames(expr string) []string {
	seen := map[string]bool{}
	for _, m := range metricRE.FindAllString(stripStrings(expr), -1) {
		seen[m] = true
	}
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// stripStrings blanks quoted strings (label values), so "up" in a value is no name.
func stripStrings(expr string) string {
	return regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(expr, `""`)
}

// BaseName is the metric family a series name belongs to: a histogram's _bucket,
// _sum and _count series belong to the histogram.
func BaseName(name string, families map[string]bool) string {
	if families[name] {
		return name
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if b, ok := strings.CutSuffix(name, suffix); ok && families[b] {
			return b
		}
	}
	return name
}

// comparisonRE is a comparison with a number: `> 0.5`, `== 0`.
var comparisonRE = regexp.MustCompile(`(==|!=|>=|<=|>|<)\s*(-?[0-9])`)

// BoolForm rewrites every comparison with a number in expr into its bool form
// (`x > 5` becomes `x > bool 5`), so that a query of an alert's expression returns
// the compared quantity's series, 0 or 1, whether or not the alert would fire. It
// reports false if expr has no such comparison (alerts.yml's convention says every
// alert has one).
func BoolForm(expr string) (string, bool) {
	n := 0
	out := comparisonRE.ReplaceAllStringFunc(expr, func(m string) string {
		n++
		sub := comparisonRE.FindStringSubmatch(m)
		return sub[1] + " bool " + sub[2]
	})
	return out, n > 0
}
