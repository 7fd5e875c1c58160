package window

import "unsafe"

// unsafeRings views the n rings allocated together by toRings. The entity keeps only
// a pointer to the first (8 bytes instead of a 24-byte slice header per entity); the
// pointer keeps the whole allocation alive, so this is an ordinary unsafe.Slice use.
func unsafeRings(first *ring, n int) []ring {
	return unsafe.Slice(first, n)
}

// hugeMin is the size from which makeHuge asks for transparent huge pages: below a few
// huge pages the TLB covers the slice anyway.
const hugeMin = 4 * hugePageSize

const hugePageSize = 2 << 20

// makeHuge is make([]T, n, c), with the backing array advised to use transparent huge
// pages when it is large (adviseHuge), so that random accesses across it cost fewer
// TLB misses.
func makeHuge[T any](n, c int) []T {
	s := make([]T, n, c)
	var zero T
	if size := uintptr(c) * unsafe.Sizeof(zero); size >= hugeMin {
		adviseHuge(unsafe.Pointer(unsafe.SliceData(s)), size)
	}
	return s
}
