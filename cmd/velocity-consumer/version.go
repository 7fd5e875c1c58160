package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/velocity-consumer/velocity-consumer/pkg/metrics"
)

// buildInfo is what the Go toolchain stamped into this binary: the main
// module's version ("(devel)" when built from a checkout rather than
// installed at a tagged version), and, when it was built inside a git
// checkout, the revision, its commit time and whether the tree had
// uncommitted changes.
type buildInfo struct {
	version, revision, time string
	modified                bool
	goVersion, platform     string
}

func readBuildInfo() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return buildInfoOf(bi)
}

// buildInfoOf reads what the toolchain stamped (nil: nothing, as in a binary
// built without module support). A build with -buildvcs=false, or outside a
// git checkout, has no vcs.* settings: the revision is then unknown.
func buildInfoOf(bi *debug.BuildInfo) buildInfo {
	b := buildInfo{version: "unknown", goVersion: runtime.Version(), platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		return b
	}
	if bi.Main.Version != "" {
		b.version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.revision = s.Value
		case "vcs.time":
			b.time = s.Value
		case "vcs.modified":
			b.modified = s.Value == "true"
		}
	}
	return b
}

// header is the value of the velocity.build header every output carries:
// "velocity-consumer/<version>[+<revision, 12 digits>][-dirty] <go version>".
func (b buildInfo) header() string {
	h := "velocity-consumer/" + b.version
	if b.revision != "" {
		h += "+" + b.revision[:min(12, len(b.revision))]
		if b.modified {
			h += "-dirty"
		}
	}
	return h + " " + b.goVersion
}

// printVersion writes the build in one line per fact.
func printVersion(w io.Writer, b buildInfo) {
	fmt.Fprintf(w, "velocity-consumer %s\n", b.version)
	rev := b.revision
	switch {
	case rev == "":
		rev = "unknown (built outside a git checkout, or with -buildvcs=false)"
	case b.modified:
		rev += " (with uncommitted changes)"
	}
	fmt.Fprintf(w, "  revision  %s\n", rev)
	if b.time != "" {
		fmt.Fprintf(w, "  committed %s\n", b.time)
	}
	fmt.Fprintf(w, "  go        %s %s\n", b.goVersion, b.platform)
}

// registerBuildInfo exports the build as velocity_build_info on reg.
func registerBuildInfo(reg prometheus.Registerer) {
	b := readBuildInfo()
	rev := b.revision
	if b.modified {
		rev += "-modified"
	}
	metrics.RegisterBuildInfo(reg, metrics.Build{Version: b.version, Revision: rev, GoVersion: b.goVersion})
}
