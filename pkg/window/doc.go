// Package window keeps exact per-entity rolling aggregates (count, sum, min, max of
// integer amounts) over several bucketed time windows at once, for millions of
// entities, and reads them back in the same call that counts an event.
//
// It is for the velocity pipeline's window stage: events arrive per entity in
// non-decreasing event time (the reorder stage guarantees it), occasionally an older
// event arrives under the --late=apply policy, and every event needs its features
// immediately. It is not for Kafka, time-zone aware calendars, approximate sketches
// or concurrent use: a Table belongs to one partition's goroutine.
//
// Semantics (docs/contract.md, the window rule): a window W:b has N = W/b buckets and the
// bucket of an event at time t is k = floor(t/b). An event's window i covers the
// entity's counted events in buckets k−N+1 … k, the event itself included.
// Arithmetic is int64 throughout; a sum or count that would overflow is an error
// (ErrOverflow), never a wrap, and amounts must be non-negative (the contract's
// 0 ≤ amount ≤ 10^15), which is what makes every partial sum bounded by the window
// sum and lets a single check at the top of Apply rule out overflow everywhere.
//
// Memory follows activity, not window length. An entity starts as a short sorted
// list of raw (time, amount) events, 16 bytes each, from which all windows are
// computed by one pass over them; only once it holds more than 32 retained
// events does it switch to one sparse ring per window holding just the non-empty
// buckets with running totals, which is O(1) per in-order event. An entity whose
// windows have all emptied relative to the watermark shrinks to a header (id, newest
// and previous event time) until its history TTL passes, so ms_since_previous stays
// right across long gaps.
//
// At millions of entities an Apply is bound by memory latency, not arithmetic: its
// lookup is two dependent cache misses (index entry, then the entity's record and
// events). A caller that knows which entities the next events name can overlap those
// misses across events with the Prefetch and PrefetchRecord hints.
package window
