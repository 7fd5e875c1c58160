//go:build !amd64

package window

// prefetchRecord is a no-op where there is no assembly version (see prefetch_amd64.go).
func prefetchRecord(rec, blob uintptr) {}
