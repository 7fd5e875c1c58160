// Package watermark turns one partition's arrival order into event-time order.
//
// A Stage owns, for one partition, the state behind the contract (docs/contract.md):
//
//   - maxSeen, the largest event time of the events it accepted, and the watermark
//     wm = maxSeen − AllowedLateness. Rejected events never move it.
//   - the reorder buffer: accepted events wait there until the watermark passes them
//     (EventTime ≤ wm) and are then released in (EventTime, Offset) order. The buffer is
//     a binary min-heap (in the manner of container/heap, but typed, so that nothing is
//     boxed) keyed by (EventTime, Offset, arrival number), fronted by a sorted run for
//     in-order arrivals (see "Fast path"). The arrival number only breaks ties between
//     equal (EventTime, Offset) pairs, which Kafka never produces, so that even a
//     caller that repeats an offset gets a deterministic order.
//   - the dedupe set: the ids of events accepted within the dedupe horizon.
//
// Offer checks an event in the contract's order: duplicate first, then late. An event
// is late when EventTime < wm; an event exactly at the watermark is not late and is
// releasable at once.
//
// # Fast path
//
// The buffer is a sorted run (a FIFO ring) in front of the heap. An accepted event at or
// after the run's newest event in (EventTime, Offset) order, which is every event of
// in-order input whatever the lateness, is appended to the run in O(1) and never touches
// the heap; only out-of-order arrivals pay the heap's O(log n). Release merges the run
// and the heap, so the order is the same as if every event had gone through the heap.
//
// # Duplicates
//
// An event is a duplicate when an event with the same EventID was accepted (released or
// still pending) on this Stage, or passed to Remember, with an event time t0 that is
// still inside the horizon: t0 ≥ maxSeen − DedupeHorizon (default 24 h). Expiry is
// driven by event time only, never by the wall clock, so replays decide exactly as the
// live run did.
//
// The set stores a 128-bit XXH3 hash of each id (github.com/zeebo/xxh3, a fixed,
// unseeded, platform-independent function), not the id itself: memory per id is fixed
// whatever the id length (a 24-byte FIFO entry holding the hash and the time, plus an
// 8-byte slot pointing at it in an open-addressing table kept 0.25 to 0.75 full: about
// 35 to 56 bytes), and the set never retains the caller's strings. The price is that two different ids could collide and the second be
// reported as a duplicate. For n ids alive inside one horizon the chance that any pair
// collides is about n²/2¹²⁹: for a billion ids in a day, about 1.5·10⁻²¹. XXH3 is not a
// cryptographic hash, so this bound assumes ids are not crafted to collide; ids are
// minted by the payment system, not by the people the features score. A process-seeded
// hash (hash/maphash) is deliberately not used: snapshots must decode identically in
// another process on another machine.
//
// The table is 64 shards by hash, each growing at its own load factor, so that no
// single rehash holds the partition for long. The ids are also kept in a FIFO in
// acceptance order, in fixed-size blocks; whenever maxSeen advances, ids at the head
// whose event time fell out of the horizon are dropped. Memory is therefore
// bounded by the ids accepted within roughly DedupeHorizon + AllowedLateness of event
// time; the table and FIFO keep their peak size rather than shrinking, so that steady
// state allocates nothing. As a sizing guide, 100 events/s on a partition with the 24 h
// default keeps 8.6 million ids, 0.3 to 0.5 GB. Lookups check the stored event time
// too, so an expired id that is still waiting behind a younger head is already treated
// as absent.
//
// # Idle release
//
// With an IdleTimeout, Idle releases everything pending once no Offer has been made for
// that long. This is the one place where wall-clock time enters (through Config.Now, so
// tests control it); it is meant for live mode only. Idle release does not move the
// watermark, so an event that arrives afterwards, is not late and is older than an event
// released by Idle is released after it: release order is sorted between idle releases,
// not across them.
//
// # Backpressure
//
// Pressure reports hysteresis over the pending count and pending bytes (Event.Size). The
// Stage never drops or refuses an accepted event; pausing the source is the caller's job.
//
// # Snapshots
//
// AppendSnapshot writes a versioned, CRC-32C checksummed binary image: maxSeen, the
// pressure flag, every pending event with all its fields in release order, and the live
// dedupe entries in acceptance order. The image is a function of the logical state
// only (heap layout and already expired ids do not appear), so a restored Stage writes
// the same bytes and makes the same future decisions as the one that was never
// interrupted. Restore rejects anything it cannot fully validate with an error; it never
// panics and never returns a half-loaded Stage.
//
// BeginSnapshot and PendingSnapshot.Finish split AppendSnapshot so that the id list,
// most of the bytes at a long horizon, can be encoded on another goroutine while the
// Stage goes on: FIFO entries are never rewritten while a view of them is open, so the
// view stays exactly the ids of the moment BeginSnapshot ran.
//
// With Config.Segments, BeginSnapshot makes a segmented snapshot instead (version 2):
// the ids accepted since the newest saved snapshot go to the store as one immutable
// segment, and the snapshot lists the segments that hold the live ids, so that each id
// is written a few times in its life instead of at every checkpoint. Restore of a
// segmented snapshot gives exactly the Stage that restoring an AppendSnapshot image of
// the same moment gives. See segments.go for the merge policy and the segments'
// lifetime (SnapshotSaved).
//
// # What it is not for
//
// It knows nothing of Kafka, decoding, windows or entities (EntityID, Amount and Aux are
// carried, not read). It is not safe for concurrent use: one goroutine owns one
// partition's Stage, as the pipeline owns one partition.
package watermark
