package definition

import (
	"fmt"

	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// EngineSpec is what pkg/feature computes for d's in-place group: the same
// features, in the engine's terms. The two packages describe one thing from
// two sides, the definition as the user wrote it and the engine as it counts
// it; this is the one place that joins them.
func EngineSpec(d *Definition) (*feature.Spec, error) {
	return engineSpec(d.Spec(), d.File)
}

// GroupSpec is one group as the engine computes it: its name, the path of its
// key and its features.
type GroupSpec struct {
	Name string // Definition.Group for the in-place group, else Group.Name
	Key  string // the key's path: input.entity_id for the in-place group, else Group.Key
	Spec *feature.Spec
}

// EngineSpecs is every group of d: [0] is the in-place group (Name d.Group,
// Key d.Input.EntityID, Spec EngineSpec(d)), then d.Groups in order, whose
// specs are laid out for codec.Transaction.Groups[i-1].Ext.
func EngineSpecs(d *Definition) ([]GroupSpec, error) {
	spec, err := EngineSpec(d)
	if err != nil {
		return nil, err
	}
	out := make([]GroupSpec, 0, 1+len(d.Groups))
	out = append(out, GroupSpec{Name: d.Group, Key: d.Input.EntityID, Spec: spec})
	for i := range d.Groups {
		g := &d.Groups[i]
		spec, err := engineSpec(g.Spec(), d.File+": group "+g.Name)
		if err != nil {
			return nil, err
		}
		out = append(out, GroupSpec{Name: g.Name, Key: g.Key, Spec: spec})
	}
	return out, nil
}

func engineSpec(ds Spec, where string) (*feature.Spec, error) {
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
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	return spec, nil
}
