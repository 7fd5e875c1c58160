package definition

import (
	"slices"
	"testing"

	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// TestEngineSpecOfTheExample: the example definition becomes the engine's
// features one for one (names, aggregates, windows, filters, distinct slots),
// and its output columns are the names docs/feature-outputs.md promises.
func TestEngineSpecOfTheExample(t *testing.T) {
	d, err := LoadFile("../../examples/features/card_features.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := EngineSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name     string
		agg      feature.Agg
		windows  []string
		filtered bool
		distinct bool
	}{
		{"txn_count", feature.Count, []string{"1m", "1h", "24h"}, false, false},
		{"spend", feature.Sum, []string{"1h", "24h"}, false, false},
		{"declines", feature.Count, []string{"10m"}, true, false},
		{"distinct_merchants", feature.DistinctCount, []string{"24h"}, false, true},
		{"card_not_present", feature.Count, []string{"1h"}, true, false},
		{"max_amount", feature.Max, []string{"24h"}, false, false},
		{"distinct_mcc", feature.DistinctCount, []string{"1h"}, false, true},
		{"large_approved", feature.Count, []string{"24h"}, true, false},
	}
	if len(spec.Features) != len(want) {
		t.Fatalf("%d features, want %d", len(spec.Features), len(want))
	}
	for i, w := range want {
		f := spec.Features[i]
		var wins []string
		for _, wi := range f.Windows {
			wins = append(wins, spec.Windows[wi].Name)
		}
		if f.Name != w.name || f.Agg != w.agg || !slices.Equal(wins, w.windows) || (f.Filter >= 0) != w.filtered || (f.Agg == feature.DistinctCount) != w.distinct {
			t.Errorf("feature %d: %+v (windows %v), want %+v", i, f, wins, w)
		}
	}
	var cols []string
	for _, c := range spec.Columns() {
		cols = append(cols, c.Name)
	}
	wantCols := []string{"txn_count_1m", "txn_count_1h", "txn_count_24h", "spend_1h", "spend_24h", "declines_10m",
		"distinct_merchants_24h", "card_not_present_1h", "max_amount_24h", "distinct_mcc_1h", "large_approved_24h",
		"distinct_merchants_exact", "distinct_mcc_exact"}
	if !slices.Equal(cols, wantCols) {
		t.Errorf("columns %v\nwant %v", cols, wantCols)
	}
}
