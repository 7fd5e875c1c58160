package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// testBinary builds the command once per test run, for the tests that run it
// as a user would: as a process, with its own stdout, stderr and exit status.
func testBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "velocity-consumer-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "velocity-consumer")
		if out, err := exec.Command("go", "build", "-o", binPath, ".").CombinedOutput(); err != nil {
			binErr = errors.New("go build: " + err.Error() + "\n" + string(out))
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// runBinary runs the built command and returns its stdout, stderr and exit
// status.
func runBinary(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(testBinary(t), args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestHelpGoesToStdout: help that was asked for is output, not an error: on
// stdout, exit status 0, nothing on stderr, so 'run --help | less' shows it.
// A mistake still goes to stderr with a non-zero status.
func TestHelpGoesToStdout(t *testing.T) {
	for _, args := range [][]string{
		{"--help"}, {"-h"}, {"help"},
		{"run", "--help"}, {"replay", "--help"}, {"demo", "--help"}, {"produce", "--help"}, {"run", "-h"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			out, errOut, code := runBinary(t, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "velocity-consumer") {
				t.Fatalf("exit %d, stderr %q, stdout %d bytes: want exit 0, the help on stdout and nothing on stderr", code, errOut, len(out))
			}
			if len(args) == 2 && !strings.Contains(out, "env VELOCITY_") {
				t.Errorf("%s --help lists no flags:\n%s", args[0], out)
			}
		})
	}
	for _, tt := range []struct {
		args []string
		code int
	}{{nil, 2}, {[]string{"frobnicate"}, 2}, {[]string{"run", "--windowz", "1m:1s"}, 1}} {
		out, errOut, code := runBinary(t, tt.args...)
		if code != tt.code || out != "" || errOut == "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %d bytes; want exit %d, the message on stderr only", tt.args, code, out, len(errOut), tt.code)
		}
	}
}

// TestVersion: 'version' and '--version' print the same build facts on
// stdout and exit 0.
func TestVersion(t *testing.T) {
	out, errOut, code := runBinary(t, "version")
	if code != 0 || errOut != "" || !strings.HasPrefix(out, "velocity-consumer ") || !strings.Contains(out, "go1.") || !strings.Contains(out, "revision") {
		t.Fatalf("version: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	if out2, _, code := runBinary(t, "--version"); code != 0 || out2 != out {
		t.Errorf("--version: exit %d, printed\n%s\nwant what version printed:\n%s", code, out2, out)
	}
}

// TestBuildInfoOf reads the toolchain's stamps: module version, revision,
// commit time and a dirty tree; and says "unknown" rather than nothing when
// they are missing.
func TestBuildInfoOf(t *testing.T) {
	b := buildInfoOf(&debug.BuildInfo{
		Main: debug.Module{Version: "v1.4.0"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123abcd"}, {Key: "vcs.time", Value: "2026-12-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
		},
	})
	var buf bytes.Buffer
	printVersion(&buf, b)
	for _, want := range []string{"velocity-consumer v1.4.0", "0123abcd (with uncommitted changes)", "committed 2026-12-01T10:00:00Z", "go1."} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	printVersion(&buf, buildInfoOf(nil))
	if !strings.Contains(buf.String(), "velocity-consumer unknown") || !strings.Contains(buf.String(), "revision  unknown") {
		t.Errorf("without build info:\n%s", buf.String())
	}
}

// TestBuildInfoMetric: the command registers velocity_build_info = 1 with
// this binary's labels on the registry it serves.
func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg)
	b := readBuildInfo()
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "velocity_build_info" {
		t.Fatalf("gathered %v, %v; want velocity_build_info alone", mfs, err)
	}
	labels := map[string]string{}
	for _, l := range mfs[0].GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != b.version || labels["goversion"] != b.goVersion || mfs[0].GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("labels %v value %v; want version %q, goversion %q, value 1", labels, mfs[0].GetMetric()[0].GetGauge().GetValue(), b.version, b.goVersion)
	}
}

func TestBuildHeaderValue(t *testing.T) {
	for _, tc := range []struct {
		b    buildInfo
		want string
	}{
		{buildInfo{version: "(devel)", goVersion: "go1.26.8"}, "velocity-consumer/(devel) go1.26.8"},
		{buildInfo{version: "v1.4.0", revision: "0123456789abcdef0123", goVersion: "go1.26.8"}, "velocity-consumer/v1.4.0+0123456789ab go1.26.8"},
		{buildInfo{version: "(devel)", revision: "abc", modified: true, goVersion: "go1.26.8"}, "velocity-consumer/(devel)+abc-dirty go1.26.8"},
	} {
		if got := tc.b.header(); got != tc.want {
			t.Errorf("header of %+v = %q, want %q", tc.b, got, tc.want)
		}
	}
}
