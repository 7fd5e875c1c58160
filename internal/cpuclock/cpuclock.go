// Package cpuclock reads the process's CPU time, for benchmarks on a shared
// machine: wall-clock ns/op includes the time a benchmark spends descheduled
// while other work runs, and CPU time per op (reported as cpu-ns/op) is the
// steadier figure under load. Not for production code paths.
package cpuclock

import "syscall"

// Nanos is the process's user plus system CPU time in nanoseconds (0 if the
// system does not say). It includes the garbage collector's workers.
func Nanos() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
