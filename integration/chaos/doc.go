//go:build integration

// Package chaos is velocity-consumer's randomized fault checker: seeded
// schedules of process and broker faults against separate OS processes of the
// built binary (`velocity-consumer run`), on a Kafka broker the test owns
// (kafkatest.StartPrivateBroker), judged only by what the topics hold.
//
// A schedule is a function of its seed (printed at the start of each run;
// VELOCITY_CHAOS_SEED=<n> replays it): bursts of seeded input (valid events
// with duplicates, late, undecodable, invalid and oversized records mixed in)
// separated by quiet periods longer than --idle-timeout, and, at seeded moments,
// SIGKILL of a random instance, SIGSTOP past --session-timeout then SIGCONT, a
// SIGSTOP within it once the input has been quiet past --idle-timeout, a
// rebalance 1 → 3 → 1 of separate processes, a broker crash and restart, and a
// graceful SIGTERM of every instance with a restart and no new input. Each
// schedule runs for one checkpoint store (kafka, or a file:// directory per
// instance so that a partition that moves meets stale snapshots) against two
// consumer groups on the same input at once, one in the default mode and one
// with --exactly-once, so two schedules cover the matrix.
//
// The checks (check_test.go, where each invariant is written above the code
// that checks it) read the input, features and dead-letter topics only, and
// compare every output with what `velocity-consumer replay` of the same input
// publishes; a re-keyed group's are also judged by its repartition topic (the
// query API's model, groupcheck_test.go, and the idle leases, lease_test.go). `go test -tags integration ./integration/chaos/` runs the short
// schedule (CI); `make chaos` runs long ones. docs/fault-checker.md tells how
// to run, read and reproduce a run.
package chaos
