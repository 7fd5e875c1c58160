// Package profiling writes a process's CPU profile and an allocation (heap)
// profile to files, for the whole life of a command: what a benchmark harness
// needs to account for a run's CPU by function. It is for profiling runs
// only; a production instance profiles on demand through --pprof instead.
package profiling

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
)

// Start begins a CPU profile into cpuPath (empty: none) and arranges an
// allocation profile into memPath (empty: none). The returned stop ends the
// CPU profile and writes the allocation profile; call it once, as the command
// returns. The allocation profile is the heap profile after a final GC: its
// alloc_space and alloc_objects samples count every allocation since the
// start (at the runtime's default sampling rate), inuse_* what is still live.
func Start(cpuPath, memPath string) (stop func() error, err error) {
	var cpu *os.File
	if cpuPath != "" {
		if cpu, err = os.Create(cpuPath); err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(cpu); err != nil {
			cpu.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
	}
	return func() error {
		var errs []error
		if cpu != nil {
			pprof.StopCPUProfile()
			errs = append(errs, cpu.Close())
		}
		if memPath != "" {
			errs = append(errs, writeHeap(memPath))
		}
		return errors.Join(errs...)
	}, nil
}

func writeHeap(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("allocation profile: %w", err)
	}
	runtime.GC() // so that the in-use figures are current
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		f.Close()
		return fmt.Errorf("allocation profile: %w", err)
	}
	return f.Close()
}
