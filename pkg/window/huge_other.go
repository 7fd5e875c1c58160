//go:build !linux

package window

import "unsafe"

// adviseHuge is a no-op off Linux (see huge_linux.go).
func adviseHuge(p unsafe.Pointer, n uintptr) {}
