//go:build linux

package sink

import (
	"syscall"
	"testing"
)

// guardedInput returns n bytes that end where an unreadable page begins, so that a
// load past the end of the input faults instead of reading a neighbour's bytes: the
// compressor's loads are unchecked (lz4Load32, lz4Load64).
func guardedInput(t *testing.T, n int) []byte {
	t.Helper()
	page := syscall.Getpagesize()
	size := (n+page-1)/page*page + page
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	if err := syscall.Mprotect(mem[size-page:], syscall.PROT_NONE); err != nil {
		t.Fatalf("mprotect: %v", err)
	}
	end := size - page
	return mem[end-n : end : end]
}
