package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestBuildInfo: one series, value 1, the build in its labels, on the
// registry passed in (and only there).
func TestBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	RegisterBuildInfo(reg, Build{Version: "v1.2.3", Revision: "abc123", GoVersion: "go1.26.8"})
	want := `
# HELP velocity_build_info Always 1; the labels say which build is running (module version, VCS revision, Go version).
# TYPE velocity_build_info gauge
velocity_build_info{goversion="go1.26.8",revision="abc123",version="v1.2.3"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "velocity_build_info"); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(prometheus.DefaultGatherer, "velocity_build_info"); n != 0 {
		t.Errorf("registered on the default registry too (%d series)", n)
	}
}
