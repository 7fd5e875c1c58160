//go:build !amd64

package window

// prefetch is a no-op where there is no assembly version (see prefetch_amd64.go).
func prefetch(p uintptr) {}

// prefetchRecord is a no-op where there is no assembly version.
func prefetchRecord(rec, blob uintptr) {}
