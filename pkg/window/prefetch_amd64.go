package window

// prefetchRecord prefetches (PREFETCHT0, a hint that never faults; see
// internal/prefetch) the line at rec (a slab record) and the first five lines
// at blob (an entity's raw allocation: id, then the events Apply scans; 320 bytes
// hold the id and up to 18 events, and the hardware prefetcher follows a longer scan).
// In BenchmarkApplyMillionEntitiesLookahead (~9-16 events per entity) three lines
// gave 200-260 ns/op, four 180-220, five 150-170; for small entities the extra lines
// cost nothing measurable (BenchmarkSeedSequence).
func prefetchRecord(rec, blob uintptr)
