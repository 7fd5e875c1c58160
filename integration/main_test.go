//go:build integration

package integration

import (
	"testing"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }
