package window

import (
	"syscall"
	"unsafe"
)

const madvHugepage = 14 // MADV_HUGEPAGE

// adviseHuge asks for transparent huge pages (MADV_HUGEPAGE) over the 2 MiB-aligned
// middle of the n bytes at p. With THP in "madvise" mode, the default here, the Go
// runtime never asks, so its heap gets 4 KiB pages and a random access into a
// 100 MB slice pays a TLB miss on top of the cache miss. Pages faulted in after the
// call come as huge pages; pages already mapped (memory the runtime reused and zeroed)
// are left to khugepaged. MADV_COLLAPSE would convert those at once but also populate
// the untouched tail of a slice, so it is not used. Errors are ignored: this is only a
// hint, and kernels without THP (or with it disabled) refuse it, changing nothing.
func adviseHuge(p unsafe.Pointer, n uintptr) {
	start := (uintptr(p) + hugePageSize - 1) &^ (hugePageSize - 1)
	end := (uintptr(p) + n) &^ (hugePageSize - 1)
	if end <= start {
		return
	}
	syscall.Syscall(syscall.SYS_MADVISE, start, end-start, madvHugepage)
}
