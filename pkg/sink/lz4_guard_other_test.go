//go:build !linux

package sink

import "testing"

// guardedInput is n bytes; only Linux builds put an unreadable page after them.
func guardedInput(t *testing.T, n int) []byte { return make([]byte, n) }
