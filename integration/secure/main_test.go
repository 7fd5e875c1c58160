//go:build integration

// Package secure tests production connectivity against real servers: the service
// and its clients over a SASL_SSL listener of a real Kafka broker (TLS with a CA made
// by the test, SCRAM users created at format time, PLAIN users in JAAS), and the
// Confluent wire format through a schema registry.
//
// The registry is franz-go's srfake (pkg/sr/srfake), served in process on a real
// loopback HTTP listener that the tests take down and bring back: no registry server
// that speaks the Confluent API could be run here (Confluent's is not published to
// the package registries we reach; Apicurio's Maven artifacts are incomplete there).
package secure

import (
	"testing"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }
