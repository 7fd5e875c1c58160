package profiling

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

var sink [][]byte

// TestStartWritesBothProfiles: each requested profile is written as a gzipped
// pprof file; an empty path writes nothing.
func TestStartWritesBothProfiles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		cpu, mem  bool
		wantFiles int
	}{
		{"both", true, true, 2},
		{"cpu only", true, false, 1},
		{"allocations only", false, true, 1},
		{"none", false, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cpu, mem := "", ""
			if tc.cpu {
				cpu = filepath.Join(dir, "cpu.pprof")
			}
			if tc.mem {
				mem = filepath.Join(dir, "mem.pprof")
			}
			stop, err := Start(cpu, mem)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 1000 {
				sink = append(sink, make([]byte, 1024+i))
			}
			sink = nil
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			ents, _ := os.ReadDir(dir)
			if len(ents) != tc.wantFiles {
				t.Fatalf("%d files, want %d", len(ents), tc.wantFiles)
			}
			for _, e := range ents {
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err != nil {
					t.Fatal(err)
				}
				zr, err := gzip.NewReader(bytes.NewReader(b))
				if err != nil {
					t.Fatalf("%s: not a gzipped profile: %v", e.Name(), err)
				}
				raw, err := io.ReadAll(zr)
				if err != nil || len(raw) == 0 {
					t.Fatalf("%s: empty or corrupt profile (%d bytes, %v)", e.Name(), len(raw), err)
				}
			}
		})
	}
}

// TestStartBadPath: a CPU profile that cannot be created is an error at
// Start, not a silent run without it.
func TestStartBadPath(t *testing.T) {
	if _, err := Start(filepath.Join(t.TempDir(), "missing", "cpu.pprof"), ""); err == nil {
		t.Fatal("no error for an uncreatable path")
	}
}
