//go:build !amd64

package prefetch

// Line is a no-op where there is no assembly version (see prefetch_amd64.go).
func Line(p uintptr) {}
