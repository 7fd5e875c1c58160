package definition

import (
	"fmt"

	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// EngineSpec is what pkg/feature computes for d: the same features, in the
// engine's terms. The two packages describe one thing from two sides, the
// definition as the user wrote it and the engine as it counts it; this is the
// one place that joins them.
func EngineSpec(d *Definition) (*feature.Spec, error) {
	ds := d.Spec()
	spec := &feature.Spec{Windows: ds.Windows, Filters: ds.Filters, Distincts: ds.Distincts}
	for _, f := range ds.Features {
		var agg feature.Agg
		switch f.Agg {
		case AggCount:
			agg = feature.Count
		case AggSum:
			agg = feature.Sum
		case AggMin:
			agg = feature.Min
		case AggMax:
			agg = feature.Max
		case AggDistinctCount:
			agg = feature.DistinctCount
		default:
			return nil, fmt.Errorf("feature %s: aggregate %v has no engine counterpart", f.Name, f.Agg)
		}
		spec.Features = append(spec.Features, feature.Feature{
			Name: f.Name, Agg: agg, Windows: f.Windows, Filter: f.Filter, Distinct: f.Distinct, MaxExact: f.MaxExact,
		})
	}
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", d.File, err)
	}
	return spec, nil
}
