package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestIndependentOracle runs the built binary's replay against
// testdata/oracle, a reference implementation of docs/contract.md's rules in
// Python (stdlib only), written from the contract without reading this code:
//
//   - difftest.py: seeded adversarial JSON-lines streams (out of order, late,
//     duplicate, invalid, boundary values, several window shapes, both late
//     policies, the guards), every output record compared, in order, and the
//     accounting invariant checked;
//   - cases.py: hand-written edge cases, and the contract's worked example row by row;
//   - avrocheck.py: the same streams as an Avro container file give the same
//     outputs as JSON lines.
//
// It needs python3 (3.9 or later, standard library only). Without it the
// test skips, saying so, unless VELOCITY_REQUIRE_PYTHON=1 (make test and CI
// set it): then it fails, so that CI cannot pass by skipping it.
// VELOCITY_ORACLE_SEEDS sets the seeds per configuration.
func TestIndependentOracle(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if v := os.Getenv("VELOCITY_REQUIRE_PYTHON"); v == "" || v == "0" {
			t.Skip("python3 not on PATH: the independent oracle is a Python program (VELOCITY_REQUIRE_PYTHON=1 makes this a failure)")
		}
		t.Fatal("python3 is required (VELOCITY_REQUIRE_PYTHON=1): the independent oracle is a Python program")
	}
	bin := testBinary(t)
	seeds := "12"
	if testing.Short() {
		seeds = "3"
	}
	if s := os.Getenv("VELOCITY_ORACLE_SEEDS"); s != "" {
		seeds = s
	}
	for _, args := range [][]string{
		{"difftest.py", "--seeds", seeds, "--no-shrink"},
		{"cases.py"},
		{"avrocheck.py", "example,default,apply_example,negative_time,ttl_apply", "3"},
	} {
		t.Run(strings.TrimSuffix(args[0], ".py"), func(t *testing.T) {
			cmd := exec.Command(py, args...)
			cmd.Dir = "testdata/oracle"
			// The scripts' temporary directories go where the test cleans up.
			cmd.Env = append(os.Environ(), "VELOCITY_BIN="+bin, "TMPDIR="+t.TempDir(), "PYTHONDONTWRITEBYTECODE=1")
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 60))
			}
			t.Logf("%s", tail(string(out), 25))
		})
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
