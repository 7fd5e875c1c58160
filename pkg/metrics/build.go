package metrics

import "github.com/prometheus/client_golang/prometheus"

// Build describes the binary that is running, for velocity_build_info.
type Build struct {
	Version   string // the main module's version, "(devel)" for a build from a checkout
	Revision  string // the VCS revision it was built from, "" if unknown
	GoVersion string // the Go toolchain, e.g. go1.26.8
}

// RegisterBuildInfo registers velocity_build_info{version, revision,
// goversion} = 1 on reg: the usual Prometheus info gauge, so that a dashboard
// or an alert can tell which build each instance runs (and join it onto other
// series with group_left). Its labels have one value per binary, so it adds a
// single series.
func RegisterBuildInfo(reg prometheus.Registerer, b Build) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "velocity_build_info",
		Help: "Always 1; the labels say which build is running (module version, VCS revision, Go version).",
	}, []string{"version", "revision", "goversion"})
	g.WithLabelValues(b.Version, b.Revision, b.GoVersion).Set(1)
	reg.MustRegister(g)
}
