// Package feature computes the features a feature definition declares — count, sum,
// min, max and distinct count per window, each optionally restricted to the events a
// filter matched — for one partition, and encodes them as the flat Avro record the
// definition generates (docs/feature-outputs.md).
//
// It is for the pipeline's window stage when a definition is active: a State wraps
// the unfiltered window.Table (which alone decides whether an event is accepted, and
// which the pipeline keeps using for prefetch hints, ms_since_previous and its
// stepped snapshot) and adds one window.Table per filter and a small set of value
// hashes per entity per distinct count. It does not decode records, evaluate
// filters or hash values: those happen at decode time (pkg/definition), and reach
// Apply as the words of codec.Transaction.Ext. It is not safe for concurrent use; a
// State belongs to one partition's goroutine.
//
// The one window rule: an event at t in window W:b (N = W/b buckets) reads the
// entity's counted events in buckets max(k−N+1, K−N+1) … k, k = floor(t/b) and K the
// bucket of the entity's newest counted event in the unfiltered table, this event
// included. Every feature reads that same range; a filtered feature counts only the
// events its filter matched within it. A distinct count counts the values whose last
// counted time falls at or after the range's first bucket (so an out-of-order event
// also counts values seen after it), exactly up to Feature.MaxExact values per entity
// and by deterministic adaptive sampling beyond, saying which in <feature>_exact.
package feature
