package main

import (
	"context"
	"testing"
)

// TestDemoAccounting runs the README's first command for a few seconds: the
// demo itself fails unless every input offset comes back exactly once on the
// output or dead-letter topic.
func TestDemoAccounting(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the whole pipeline for a few seconds")
	}
	err := cmdDemo(context.Background(), []string{"--duration", "3s", "--rate", "2000", "--entities", "5000", "--log-level", "error"})
	if err != nil {
		t.Fatal(err)
	}
}
