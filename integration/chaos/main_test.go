//go:build integration

package chaos

import (
	"testing"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
)

func TestMain(m *testing.M) { kafkatest.Main(m) }
