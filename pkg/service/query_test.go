package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// TestReadMatchesOracle: once the stream is processed, a read of every entity through
// its partition's worker equals the as-of aggregates recomputed from the stream.
func TestReadMatchesOracle(t *testing.T) {
	const partitions = 3
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 4, 2000, partitions)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	readOutputs(t, brokers, len(st.Records), time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for p, evs := range st.ByPart {
		counted := oracle.Counted(oracle.Config{Specs: cfg.Specs, Topic: inTopic, Partition: p}, evs)
		entities := map[string]bool{}
		for _, e := range evs {
			entities[e.Entity] = true
		}
		req := NewReadRequest(0, len(cfg.Specs))
		for ent := range entities {
			req.Items = append(req.Items, ReadItem{Entity: ent, UseDefault: true, Aggs: make([]window.Agg, len(cfg.Specs))})
		}
		// The partition may still be settling its last batch's outputs: the
		// outputs were read, so its state has counted them.
		if err := svc.Read(ctx, p, req); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		for _, it := range req.Items {
			if it.Err != nil {
				t.Fatalf("partition %d: %v", p, it.Err)
			}
			want := oracle.WindowsAt(cfg.Specs, counted, it.Entity, it.Info.AsOf)
			for i, w := range want {
				if a := it.Aggs[i]; a.Count != w.Count || a.Sum != w.SumMinor || a.Min != w.MinMinor || a.Max != w.MaxMinor {
					t.Fatalf("partition %d window %s at %d: got %+v, oracle %+v", p, w.Name, it.Info.AsOf, a, w)
				}
			}
			if want := counted[len(counted)-1].Time; it.Info.AsOf != want {
				t.Fatalf("partition %d: as_of %d, want the newest counted event time %d", p, it.Info.AsOf, want)
			}
			if it.Info.LastOffset != evs[len(evs)-1].Offset || !it.Info.Known {
				t.Fatalf("partition %d: info %+v", p, it.Info)
			}
		}
	}
	if err := svc.Read(ctx, partitions, NewReadRequest(1, len(cfg.Specs))); !errors.Is(err, ErrNotOwned) {
		t.Fatalf("a partition that does not exist: %v", err)
	}
	// A preview of an event after the stream: it counts the entity's newest window too.
	p := int32(-1)
	var last int64
	for part, evs := range st.ByPart {
		for _, e := range evs {
			last = max(last, e.Time)
			if e.Entity == "card-1" {
				p = part
			}
		}
	}
	pv := &pipeline.Preview{}
	req := NewReadRequest(1, len(cfg.Specs))
	req.Items[0] = ReadItem{Entity: "card-1", Preview: pv, Tx: codec.Transaction{EventID: "preview-1", AmountMinor: 5, EventTime: last + 1}, HasEventID: true}
	if err := svc.Read(ctx, p, req); err != nil || pv.Outcome != "" || pv.Features.Windows[1].Count < 2 {
		t.Fatalf("preview: %v %+v", err, pv)
	}
}
