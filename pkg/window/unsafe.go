package window

import "unsafe"

// unsafeRings views the n rings allocated together by toRings. The entity keeps only
// a pointer to the first (8 bytes instead of a 24-byte slice header per entity); the
// pointer keeps the whole allocation alive, so this is an ordinary unsafe.Slice use.
func unsafeRings(first *ring, n int) []ring {
	return unsafe.Slice(first, n)
}
