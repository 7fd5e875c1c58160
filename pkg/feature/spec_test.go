package feature

import (
	"strings"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

func TestValidate(t *testing.T) {
	ws, err := window.ParseSpecs("1m:1s,5m:5s,1h:1m,24h:1h")
	if err != nil {
		t.Fatal(err)
	}
	ok := func() Spec {
		return Spec{Windows: ws, Filters: 2, Distincts: 1, Features: []Feature{
			{Name: "n", Agg: Count, Windows: []int{0, 3}, Filter: -1},
			{Name: "m", Agg: DistinctCount, Windows: []int{3}, Filter: 1, Distinct: 0},
		}}
	}
	cases := []struct {
		name   string
		modify func(*Spec)
		want   string // "" = valid
	}{
		{"valid", func(*Spec) {}, ""},
		{"no windows", func(s *Spec) { s.Windows = nil }, "0 windows"},
		{"hand-made window", func(s *Spec) {
			s.Windows = append([]window.Spec{{Name: "x", WindowMs: 10, BucketMs: 5, Buckets: 3}}, ws[1:]...)
		}, "inconsistent"},
		{"repeated window", func(s *Spec) { s.Windows = append(append([]window.Spec{}, ws...), ws[0]) }, "appears twice"},
		{"too many filters", func(s *Spec) { s.Filters = 33 }, "filters"},
		{"too many distincts", func(s *Spec) { s.Distincts = 33 }, "distinct slots"},
		{"no features", func(s *Spec) { s.Features = nil }, "0 features"},
		{"bad name", func(s *Spec) { s.Features[0].Name = "1n" }, "name must match"},
		{"name with dash", func(s *Spec) { s.Features[0].Name = "a-b" }, "name must match"},
		{"empty name", func(s *Spec) { s.Features[0].Name = "" }, "name must match"},
		{"unset agg", func(s *Spec) { s.Features[0].Agg = 0 }, "unknown aggregate"},
		{"no feature windows", func(s *Spec) { s.Features[0].Windows = nil }, "no windows"},
		{"window index", func(s *Spec) { s.Features[0].Windows = []int{4} }, "out of range"},
		{"window twice", func(s *Spec) { s.Features[0].Windows = []int{1, 1} }, "listed twice"},
		{"filter out of range", func(s *Spec) { s.Features[0].Filter = 2 }, "filter 2 out of range"},
		{"filter below -1", func(s *Spec) { s.Features[0].Filter = -2 }, "out of range"},
		{"distinct slot", func(s *Spec) { s.Features[1].Distinct = 1 }, "distinct slot 1"},
		{"max exact", func(s *Spec) { s.Features[1].MaxExact = MaxMaxExact + 1 }, "max exact"},
		{"duplicate feature", func(s *Spec) { s.Features[1].Name = "n" }, "already used by feature 0"},
		{"exact collides", func(s *Spec) {
			s.Features = append(s.Features, Feature{Name: "m_exact", Agg: Count, Windows: []int{0}, Filter: -1})
			s.Features[1].Windows = []int{0}
		}, ""}, // m_exact_1m and m_exact differ: valid
		{"fixed field", func(s *Spec) {
			w, _ := window.NewSpec(7, 7)
			s.Windows = append(append([]window.Spec{}, ws...), w)
			s.Features[0].Name = "late"
		}, ""}, // late_1m is not late
		{"span", func(s *Spec) {
			w1, _ := window.NewSpec(100*24*3600*1000, 24*3600*1000)
			w2, _ := window.NewSpec(7, 1)
			s.Windows = []window.Spec{w1, w2}
			s.Features = []Feature{{Name: "d", Agg: DistinctCount, Windows: []int{0, 1}, Filter: -1}}
		}, "split the feature"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := ok()
			c.modify(&s)
			err := s.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("want valid, got %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("want an error containing %q, got %v", c.want, err)
			}
		})
	}
}

// TestColumnNamesUnique: window names hold no '_' and no fixed field ends in
// "_<window>" or "_exact", so unique feature names give unique field names; the
// names that look alike are all accepted and all present.
func TestColumnNamesUnique(t *testing.T) {
	ws, _ := window.ParseSpecs("1m:1s,5m:1m")
	s := Spec{Windows: ws, Distincts: 1, Features: []Feature{
		{Name: "a", Agg: DistinctCount, Windows: []int{0, 1}, Filter: -1},
		{Name: "a_exact", Agg: Count, Windows: []int{0}, Filter: -1},
		{Name: "a_1m", Agg: Count, Windows: []int{1}, Filter: -1},
		{Name: "ms_since", Agg: Count, Windows: []int{0}, Filter: -1},
		{Name: "source", Agg: DistinctCount, Windows: []int{0}, Filter: -1},
	}}
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range s.Columns() {
		if seen[c.Name] {
			t.Errorf("column %s twice", c.Name)
		}
		seen[c.Name] = true
	}
	if len(seen) != 2+1+1+1+1+2 {
		t.Errorf("%d columns: %v", len(seen), seen)
	}
}
