//go:build integration

// Package recovery holds the crash, recovery and rebalance tests of the live
// service (separate processes, SIGKILL) on a real Kafka broker found or
// started by integration/kafkatest. It is its own package so its helpers do
// not collide with the other integration tests'.
package recovery

import (
	"testing"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }
