package pipeline

// The query API's read of a feature definition's features (docs/api.md, "Features
// under a definition"): LookupFeatures, the features of one entity at an as-of time.
//
// It follows Lookup's rules (query.go) exactly: the same default as-of time and
// accepted range (AsOf), the same per-entity retention check, and events pending in
// the reorder buffer (a re-keyed group's second stage: its Merger) are not counted.
// What it reads is feature.State.ReadAt, which gives at asOf the values the entity's
// next features record would carry if an event at asOf with no effect on any feature
// (matching no filter, carrying no distinct value, amount aside) were counted now:
// every window ends at asOf's bucket, a filtered feature reads the filter's table
// over the same buckets, and a distinct count counts the values last counted at or
// after the window's first bucket, the thresholds an in-order event at asOf
// computes. (Such an event's own contribution to the unfiltered count, sum, min and
// max is left out: the read counts nothing.)
//
// Invariant: like Lookup it changes nothing. feature.State.ReadAt reads the tables
// through window.Table.ReadAt and the distinct sets through their count, and writes
// only the caller's row and the State's per-call scratch (the distinct thresholds and
// the filtered tables' out slices), which Apply rewrites before it reads them. So
// Process's outputs and snapshots are byte for byte what they would have been
// without it, and it runs on the partition's goroutine like every Processor method.

import (
	"errors"

	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// ErrNoFeatures: LookupFeatures on a processor without a feature definition.
var ErrNoFeatures = errors.New("pipeline: no feature definition (--features)")

// FeatureSpec is the processor's feature definition (Config.Features), nil without
// one. Shared: do not modify it.
func (p *Processor) FeatureSpec() *feature.Spec {
	if p.fstate == nil {
		return nil
	}
	return p.fstate.Spec()
}

// LookupFeatures writes entity's features at asOf into row (feature.NewRow of
// FeatureSpec), with useDefault at the default as-of time: the read Lookup makes,
// of every feature of the definition instead of the unfiltered windows (see the top
// of this file). An unknown entity is Known false with a row of zeros (min and max
// null, exact true). Errors: ErrNoFeatures, an *AsOfRangeError, or one wrapping
// window.ErrNotRetained or window.ErrInput (a row of the wrong shape); then row is
// unspecified. It allocates nothing when it succeeds.
func (p *Processor) LookupFeatures(entity string, asOf int64, useDefault bool, row *feature.Row) (LookupInfo, error) {
	def, from, to := p.AsOf()
	if useDefault {
		asOf = def
	}
	// Pending, not the reorder buffer's count: a re-keyed group's second stage holds
	// its waiting events in its Merger.
	info := LookupInfo{AsOf: asOf, Pending: p.Pending(), LastOffset: p.next - 1, From: from, To: to}
	if p.fstate == nil {
		return info, ErrNoFeatures
	}
	if asOf < from || asOf > to {
		return info, &AsOfRangeError{AsOf: asOf, From: from, To: to}
	}
	_, known, err := p.fstate.ReadAt(entity, asOf, row)
	info.Known = known
	return info, err
}
