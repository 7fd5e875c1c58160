package prefetch

// Line asks the CPU to start loading the cache line at p (PREFETCHT0). It is a hint:
// it never faults and never changes memory, so p may be any address, even one that is
// stale or unmapped. p is a uintptr so that no pointer escapes.
func Line(p uintptr)
