// Package metrics defines every Prometheus collector the service exports, in one
// place, registered once on a registry the caller passes in.
//
// Labels are bounded: partition and dead-letter reason, never an entity. The
// metrics therefore carry no entity data and are safe to expose.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the service's collectors.
type Metrics struct {
	RecordsIn   *prometheus.CounterVec
	Features    *prometheus.CounterVec
	DeadLetters *prometheus.CounterVec
	LateApplied *prometheus.CounterVec
	KeyMismatch *prometheus.CounterVec
	// GroupKeyMissing counts, per re-keyed group, accepted records without a
	// key for it (null, absent or empty): they count for the other groups only.
	GroupKeyMissing *prometheus.CounterVec
	// HopDuplicates counts, per re-keyed group, hop records its second stage
	// received again (a producer retry, a restart from an older checkpoint, an
	// old owner) and did not count twice; HopStaleIdle the idle markers it did
	// not honour because they came from an old owner; HopIdleExpired the idle
	// declarations whose lease ran out before their owner renewed them.
	HopDuplicates  *prometheus.CounterVec
	HopStaleIdle   *prometheus.CounterVec
	HopIdleExpired *prometheus.CounterVec
	// GroupPartitions, GroupRestoring and GroupPaused are AssignedPartition,
	// PartitionsRestoring and PausedPartitions of a re-keyed group's second
	// stage, by group.
	GroupPartitions *prometheus.GaugeVec
	GroupRestoring  *prometheus.GaugeVec
	GroupPaused     *prometheus.GaugeVec
	ReorderBuffer   *prometheus.GaugeVec
	WatermarkLag    *prometheus.GaugeVec
	Latency         prometheus.Histogram
	// AddedLatency is, per batch, the time from the poll that fetched it to
	// the moment its last output was handed to the producer: what the service
	// itself adds, without the reorder wait or the broker's acknowledgement.
	AddedLatency    prometheus.Histogram
	Entities        *prometheus.GaugeVec
	EntitiesEvicted *prometheus.CounterVec
	// DedupeIDs is each partition's dedupe set size (pipeline.Processor.DedupeIDs),
	// about 40-50 bytes of memory per id; DedupeEvicted counts the ids the
	// --max-dedupe-ids cap made it forget (Processor.DedupeCapEvictions).
	DedupeIDs         *prometheus.GaugeVec
	DedupeEvicted     *prometheus.CounterVec
	CheckpointSeconds prometheus.Histogram
	CheckpointBytes   *prometheus.GaugeVec
	// CheckpointWritten counts the bytes checkpoints hand to the store: each
	// snapshot plus the dedupe segment it writes (see pkg/watermark), the
	// I/O that checkpoints cost.
	CheckpointWritten *prometheus.CounterVec
	// CheckpointPause is each stop of a partition's processing to take a snapshot of
	// its state: one per checkpoint with --exactly-once, and in the default mode
	// the beginning and each ~1 ms step (the rest, flush, save and commit, runs
	// beside the partition).
	CheckpointPause   prometheus.Histogram
	CheckpointErrors  prometheus.Counter
	SnapshotFallbacks prometheus.Counter
	// SnapshotStepBacks counts exactly-once restores that found the newest snapshot
	// ahead of the committed transaction and resumed from the previous one.
	SnapshotStepBacks prometheus.Counter
	// TxnPartitionsLost counts exactly-once partitions whose transaction was
	// fenced or aborted under them (another instance took the partition over,
	// or the coordinator aborted it): their open work was dropped uncommitted.
	TxnPartitionsLost prometheus.Counter
	// TakeoversInterrupted counts takeovers of assigned partitions that a new
	// rebalance cut short; they are redone in the next group session.
	TakeoversInterrupted prometheus.Counter
	// Stalls counts stalls of the process long enough that the group may have
	// moved its partitions meanwhile, as each of its group consumers saw them
	// (pkg/service's stall guard): the query API refuses reads after one until
	// the coordinator confirms the membership.
	Stalls            prometheus.Counter
	CommitErrors      prometheus.Counter
	ProduceErrors     prometheus.Counter
	PausedPartitions  prometheus.Gauge
	ConsumerLag       *prometheus.GaugeVec
	AssignedPartition prometheus.Gauge
	// SnapshotsStale counts restores whose snapshot was behind the group's
	// committed offset (written by this instance before another owner moved
	// the partition on): not resumed, the partition was rebuilt from the
	// committed offset.
	SnapshotsStale prometheus.Counter
	// OffsetsSkipped counts input offsets that retention deleted before this
	// service processed them: the state never saw them.
	OffsetsSkipped *prometheus.CounterVec
	// InputPartitionsAdded is how many partitions the input topic has gained
	// since the start, as far as the group has assigned them to this instance.
	InputPartitionsAdded prometheus.Gauge
	// ProgressAge is, per partition, the seconds since its goroutine last
	// finished a step (a batch, a tick, a checkpoint): /healthz fails when it
	// grows past the bound a step may take.
	ProgressAge *prometheus.GaugeVec
	// CheckpointAge is, per partition, the seconds since its last durable
	// checkpoint (snapshot saved and offset committed).
	CheckpointAge *prometheus.GaugeVec
	// PartitionsRestoring is how many partitions are being taken over right
	// now (fencing, restore, warm-up): /readyz is false meanwhile.
	PartitionsRestoring prometheus.Gauge
}

// New creates the collectors and registers them (plus the Go and process
// collectors) on reg.
func New(reg prometheus.Registerer) *Metrics {
	part := []string{"partition"}
	m := &Metrics{
		RecordsIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_records_in_total", Help: "Input records consumed, by partition.",
		}, part),
		Features: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_features_total", Help: "Features records produced, by partition.",
		}, part),
		DeadLetters: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_dead_letters_total", Help: "Dead letters produced, by reason (decode, invalid:<field>, late, duplicate, too_large).",
		}, []string{"reason"}),
		LateApplied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_late_applied_total", Help: "Late events counted anyway under --late=apply, by partition.",
		}, part),
		KeyMismatch: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_key_mismatch_total", Help: "Input records whose key is not their entity_id (null keys included), by partition: the entity may be split across partitions.",
		}, part),
		GroupKeyMissing: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_group_key_missing_total", Help: "Accepted records without a key for a re-keyed group (null, absent or empty), by group: counted for the other groups only.",
		}, []string{"group"}),
		HopDuplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_hop_duplicates_total", Help: "Hop records a re-keyed group's second stage received again (retry, restart, old owner) and did not count twice, by group.",
		}, []string{"group"}),
		HopStaleIdle: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_hop_stale_idle_markers_total", Help: "Idle markers from an old owner of an input partition that a re-keyed group's second stage did not honour, by group.",
		}, []string{"group"}),
		HopIdleExpired: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_hop_idle_expired_total", Help: "Idle declarations of input partitions whose lease ran out before their owner renewed it (a lost owner, or renewals held up), by group: the partition holds the group's frontier again.",
		}, []string{"group"}),
		GroupPartitions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_group_assigned_partitions", Help: "Repartition partitions this instance computes a re-keyed group for, by group.",
		}, []string{"group"}),
		GroupRestoring: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_group_partitions_restoring", Help: "Repartition partitions of a re-keyed group being taken over right now, by group.",
		}, []string{"group"}),
		GroupPaused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_group_paused_partitions", Help: "Repartition partitions of a re-keyed group paused for backpressure, by group.",
		}, []string{"group"}),
		ReorderBuffer: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_reorder_buffer_events", Help: "Events waiting in the reorder buffer, by partition.",
		}, part),
		WatermarkLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_watermark_lag_seconds", Help: "Wall clock minus the partition's event-time watermark.",
		}, part),
		AddedLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "velocity_added_latency_seconds",
			Help:    "Per batch, from the poll that fetched it to the hand-off of its last output to the producer: the time the service adds, without the reorder wait of --allowed-lateness or the broker's acknowledgement.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		Latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "velocity_event_to_feature_latency_seconds",
			Help:    "Time from a record's arrival at the consumer to its features record being acknowledged by the broker.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		Entities: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_entities", Help: "Entities tracked in the window table, by partition.",
		}, part),
		EntitiesEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_entities_evicted_total", Help: "Entities evicted: cause=idle (all windows empty) or cap (--max-entities).",
		}, []string{"cause"}),
		DedupeIDs: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_dedupe_ids", Help: "Event ids the partition remembers to dead-letter duplicates (--dedupe-horizon, capped by --max-dedupe-ids): about 40-50 bytes of memory each.",
		}, part),
		DedupeEvicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_dedupe_ids_evicted_total", Help: "Event ids forgotten before their --dedupe-horizon because of --max-dedupe-ids, by partition: a duplicate of one is not caught.",
		}, part),
		CheckpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "velocity_checkpoint_duration_seconds", Help: "Time to flush, snapshot and commit one partition.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		CheckpointPause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "velocity_checkpoint_pause_seconds", Help: "Each stop of a partition's processing to take a checkpoint's snapshot of its state (the snapshot is taken in steps of about 1 ms between batches).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
		CheckpointBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_checkpoint_size_bytes", Help: "Size of the partition's last snapshot (without the dedupe segments it lists).",
		}, part),
		CheckpointWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_checkpoint_written_bytes_total", Help: "Bytes checkpoints wrote to the store: snapshots and the dedupe id segments they added.",
		}, part),
		CheckpointErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_checkpoint_errors_total", Help: "Snapshot saves that failed (the offset was not committed).",
		}),
		SnapshotFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_snapshot_fallbacks_total", Help: "Restores that could not use the newest snapshot (corrupt, or a dedupe segment it lists unusable) and used the previous one, or rebuilt by a warm-up read.",
		}),
		SnapshotStepBacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_snapshot_stepbacks_total", Help: "Exactly-once restores whose newest snapshot was ahead of the committed transaction (a crash between save and commit), so the previous one was used.",
		}),
		TxnPartitionsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_txn_partitions_lost_total", Help: "Exactly-once partitions whose open transaction was fenced or aborted under them; their uncommitted work was dropped and the partition restored from its last commit (by us if we still own it).",
		}),
		TakeoversInterrupted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_takeovers_interrupted_total", Help: "Takeovers of newly assigned partitions (fencing, restore, warm-up) that another rebalance cut short; the partitions still ours are taken over again in the next group session.",
		}),
		Stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_stalls_total", Help: "Stalls of the process longer than --session-timeout less 1.5 heartbeat intervals (the group may have moved its partitions), as each of its group consumers saw them; the query API refused reads after each until the group coordinator confirmed the membership.",
		}),
		CommitErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_commit_errors_total", Help: "Offset commits that failed.",
		}),
		ProduceErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_produce_errors_total", Help: "Produce requests that failed after the client's retries (each stops the service).",
		}),
		PausedPartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "velocity_paused_partitions", Help: "Partitions whose fetching is paused for backpressure.",
		}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_consumer_lag_records", Help: "High watermark minus the next offset to process, by partition.",
		}, part),
		AssignedPartition: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "velocity_assigned_partitions", Help: "Input partitions currently assigned to this instance.",
		}),
		SnapshotsStale: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "velocity_snapshots_stale_total", Help: "Restores whose snapshot was behind the group's committed offset (another owner moved the partition on since it was saved): not resumed; the partition was rebuilt from the committed offset.",
		}),
		OffsetsSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "velocity_input_offsets_skipped_total", Help: "Input offsets deleted by retention before they were processed, by partition: the features never counted them.",
		}, []string{"partition"}),
		InputPartitionsAdded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "velocity_input_partitions_added", Help: "Partitions added to the input topic since the start that the group assigned to this instance: entities keyed by entity_id moved to other partitions, and their features started again.",
		}),
		ProgressAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_partition_progress_age_seconds", Help: "Seconds since the partition's goroutine last finished a step (batch, tick or checkpoint), by partition.",
		}, []string{"partition"}),
		CheckpointAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "velocity_checkpoint_age_seconds", Help: "Seconds since the partition's last durable checkpoint (snapshot saved, offset committed), by partition.",
		}, []string{"partition"}),
		PartitionsRestoring: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "velocity_partitions_restoring", Help: "Partitions being taken over right now (fencing, restore, warm-up).",
		}),
	}
	reg.MustRegister(
		m.RecordsIn, m.Features, m.DeadLetters, m.LateApplied, m.KeyMismatch, m.ReorderBuffer, m.WatermarkLag,
		m.GroupKeyMissing, m.HopDuplicates, m.HopStaleIdle, m.HopIdleExpired, m.GroupPartitions, m.GroupRestoring, m.GroupPaused,
		m.Latency, m.AddedLatency, m.Entities, m.EntitiesEvicted, m.DedupeIDs, m.DedupeEvicted, m.CheckpointSeconds, m.CheckpointPause, m.CheckpointBytes, m.CheckpointWritten,
		m.CheckpointErrors, m.SnapshotFallbacks, m.SnapshotStepBacks, m.TxnPartitionsLost, m.TakeoversInterrupted, m.Stalls, m.CommitErrors, m.ProduceErrors,
		m.PausedPartitions, m.ConsumerLag, m.AssignedPartition,
		m.SnapshotsStale, m.OffsetsSkipped, m.InputPartitionsAdded, m.ProgressAge, m.CheckpointAge, m.PartitionsRestoring,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Partition formats a partition number as a label value.
func Partition(p int32) string { return strconv.Itoa(int(p)) }

// ForgetPartition removes a partition's series when it is revoked, so a
// rebalanced-away partition does not keep reporting stale gauges.
func (m *Metrics) ForgetPartition(label string) {
	l := prometheus.Labels{"partition": label}
	m.ReorderBuffer.Delete(l)
	m.WatermarkLag.Delete(l)
	m.Entities.Delete(l)
	m.DedupeIDs.Delete(l)
	m.CheckpointBytes.Delete(l)
	m.ConsumerLag.Delete(l)
	m.ProgressAge.Delete(l)
	m.CheckpointAge.Delete(l)
}
