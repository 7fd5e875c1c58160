// Package replay runs recorded transactions through the same per-partition
// pipeline as the live service, for backtests: a topic range, an Avro object
// container file or a JSON-lines file in; a topic, JSON-lines or Parquet out.
//
// Replay is the deterministic twin of pkg/service. Each partition gets its own
// pipeline.Processor configured exactly as the live one, fed its records in
// offset order, and flushed at the end of the range instead of being released
// by the live idle timeout: no wall-clock time enters, so the features values
// are byte for byte those the live service publishes for the same records
// (given a live run whose idle release did not fire early, and the same
// history: a range that starts mid-partition starts with empty windows unless
// TopicConfig.WarmUpFrom feeds the records before it without emitting).
//
// Partitions are replayed one after another in ascending order, so every output
// holds partition 0's outputs (in emit order), then partition 1's, and so on.
// That makes an output file a pure function of the input range and the flags.
// Re-keyed groups (Config.Groups) write in the order of that schedule too, but
// their second stages are fed the earlier partitions' hop records only as the
// last partition needs them, from a spool (memory, then a temporary file), so
// that they hold events for about the allowed lateness rather than the whole
// range (groups.go).
//
// File outputs are written to NAME.partial and renamed to NAME only when the
// whole range has been replayed and the file is synced, so a file under its
// final name is always complete; an interrupted replay removes the .partial.
//
// This package is not a consumer group, does not checkpoint and does not
// commit offsets: a replay reads a fixed range and leaves the group alone.
package replay
