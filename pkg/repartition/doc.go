// Package repartition is the part of a re-keyed feature group that both the live
// service and replay use: the hop record that carries one input transaction from its
// input partition to the repartition partition of another key, and the Merger that
// turns what one repartition partition receives from every input partition, in
// whatever interleaving, into one deterministic event-time order.
//
// It knows nothing of Kafka: the caller produces and fetches the records, decides
// topics and partitions, and checkpoints Merger snapshots beside its offsets. It does
// not validate transactions, deduplicate event ids or decide lateness: those are
// decided once, at the input partition (package watermark), and the hop carries the
// result. docs/repartition.md states the rule, a worked example and the guarantees
// across the hop.
//
// # The rule
//
// Each input (source) partition p sends, to every repartition partition, its events
// with that partition's keys in the order it accepts them (pkg/pipeline hops an event
// when its input partition accepts it), and a watermark W_p with each: the
// promise that nothing it sends later has an event time below W_p (EventWatermark).
// When it has no event for a repartition partition it sends a marker with W_p alone.
// The Merger keeps w_p, the largest W_p received from each source, and the released
// frontier F, which only rises: F = min over the non-idle sources of w_p. Every event
// strictly below F is released, in (EventTime, Source, Offset) order. An event
// exactly at F is held, since its source may still send another one at F.
//
// Without idle sources the released sequence is therefore a function of the set of
// events the sources sent, never of the interleaving: an event is released only once
// every source has promised not to send anything before it, and the order is a total
// order on the events.
//
// # Counted once, by (source partition, source offset), in bounded memory
//
// A source re-sends hop records: after a restart from a checkpoint older than its
// last produce (a crash, a .prev snapshot), everything it had produced after that
// checkpoint; a frozen old owner (a zombie, before the checkpoint store fences it)
// produces the same records as the new owner, interleaved with them. The Merger must
// count each (source, offset) once without remembering every offset it ever counted.
//
// What makes this exact is that a source is deterministic: the events it hops, their
// times and their payload are a function of its input and its configuration (the
// same definition, lateness and dedupe settings), whichever owner runs it and from
// whichever checkpoint; only the watermarks attached and the moments of sending
// differ. Call that set S_p. Then the promise behind every watermark W received from
// p holds over S_p: every event of S_p with a time below W was produced, by the
// sender of W before W, or by an earlier owner before the checkpoint the sender
// started from (the hop is flushed before a checkpoint commits). Each producer's
// records reach a partition in the order it sent them, with no gap (the idempotent
// producer), so all of them reached this Merger before W did. Hence, with w_p the
// largest watermark received from p before the record at hand:
//
//  1. An event of p with EventTime < w_p was received before: a duplicate. This
//     needs no memory beyond w_p, and it is the common case of a re-send, because
//     an event normally carries its own time as its watermark.
//  2. Otherwise, if it is still pending (not yet released), its (EventTime, Offset)
//     is in one of p's two pending queues (the events that arrived in order, and the
//     few that arrived behind p's newest), which are sorted: a duplicate, found by a
//     binary search (or, for an event after the first queue's tail, by one
//     comparison).
//  3. Otherwise, if EventTime < F, it was either released or dead-lettered at or
//     above w_p (only the idle rule releases past a source's own watermark), or it
//     was never received. The Merger keeps the (EventTime, Offset) of exactly those
//     events, per source, until w_p passes them (then rule 1 covers them): found
//     there it is a duplicate, otherwise it is new and late (LateAfterIdle).
//  4. Otherwise it is new: pending.
//
// So memory is the pending events, three words per source, and per source the events
// counted at or above that source's own watermark, which only an idle episode creates
// and the source's next watermark above them removes. No offset history is kept.
//
// The precondition is that every producer of a source partition's hop runs the same
// definition and settings; a changed definition needs a new consumer group (and so
// new repartition topics), or the second stage would keep whichever copy it saw
// first. Events are never compared by event id: the same id on two input partitions
// is two transactions to the sources, and which copy a second stage kept would
// depend on arrival order.
//
// # The idle rule
//
// An input partition with no input for the idle timeout would hold F back forever.
// The source decides it is idle, by the same wall-clock rule as its own reorder
// buffer (watermark.Stage.Idle), and says so in a marker (Record.Idle). The Merger
// then leaves that source out of the minimum until the source sends anything else,
// or until the marker's lease (Record.Lease) runs out: the source renews its
// declaration while its input stays quiet, and one whose owner is lost stops, so
// after the lease the source holds F at its watermark again. The lease runs on the
// Merger's clock, the largest Kafka timestamp of the records it has read
// (Record.LogTime). The decision is written into the repartition topic, its records
// and their timestamps, so the Merger itself reads no wall clock: restoring a
// snapshot and re-reading the topic from the snapshot's offset releases exactly what
// the first reading released. An idle marker from an owner
// epoch older than the newest the Merger has seen from that source is not honoured
// (its watermark still is): a frozen old owner that wakes up finds its input silent
// and would otherwise declare idle a partition its new owner is feeding. When every
// source is idle everything pending is released and F moves just past it.
//
// An event that arrives from a source after F has passed its time (possible only
// because that source was left out of the minimum) cannot be placed in order: Offer
// returns LateAfterIdle and does not keep it: the caller counts it out of order (the
// pipeline marks its row late) or, if it cannot, dead-letters it with
// ReasonLateAfterIdle, and the group's accounting holds (one output record or one
// dead letter per input offset). A re-send of it is a duplicate, not a second output.
//
// With idle markers the interleaving matters: which events an idle source's late
// arrivals overtake depends on where its markers fall among the others. That is the
// one interleaving-dependent rule, as the idle timeout is the one wall-clock rule.
//
// # Snapshots
//
// AppendSnapshot writes the whole logical state (F, the clock, each source's
// watermark, epoch, idle flag and lease, its pending events with every field in order, and its events counted
// at or above its watermark), versioned and CRC-32C checksummed. The bytes are a
// function of the state alone, and Restore accepts only canonical images, so a
// restored Merger writes the same bytes and releases the same events as one that was
// never interrupted.
//
// Not safe for concurrent use: one goroutine owns one repartition partition's Merger.
package repartition
