package prefetch

import (
	"testing"
	"unsafe"
)

// TestLineIsHarmless checks that a prefetch of any address, including nil and one
// past a slice, neither faults nor changes memory.
func TestLineIsHarmless(t *testing.T) {
	b := []byte{1, 2, 3}
	for _, p := range []uintptr{0, 1, uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[0])) + 1<<20} {
		Line(p)
	}
	if b[0] != 1 || b[1] != 2 || b[2] != 3 {
		t.Fatalf("memory changed: %v", b)
	}
}
