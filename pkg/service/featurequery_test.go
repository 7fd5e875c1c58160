package service

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/checkpoint"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

const readDefinition = `
version: service-read
input: {event_id: event_id, entity_id: entity_id, event_time: event_time, amount: amount_minor}
windows: [10s:1s, 1m:10s, 1h:1m]
features:
  - {name: n, agg: count, windows: [10s, 1h]}
  - {name: eur, agg: sum, windows: [1m], where: [{field: currency, eq: EUR}]}
  - {name: small, agg: min, windows: [1h], where: [{field: amount_minor, lt: 300}]}
  - {name: cur, agg: distinct_count, field: currency, windows: [1m, 1h], max_exact: 2}
`

// TestReadFeaturesMatchesProcessor: under a definition, a read whose items ask for
// features (ReadItem.Row) gets, through the partition's worker, what a Processor fed
// the same partition's records answers, and the window lookups of the same request
// are served beside them; without a definition such an item is ErrNoFeatures.
func TestReadFeaturesMatchesProcessor(t *testing.T) {
	const partitions = 2
	brokers := newCluster(t, partitions)
	st := streamtest.Generate(inTopic, 7, 1500, partitions)
	produce(t, brokers, st.Records)
	d, err := definition.Parse("read.yaml", []byte(readDefinition))
	if err != nil {
		t.Fatal(err)
	}
	comp, err := definition.Compile(d, "", codec.DefaultLimits())
	if err != nil {
		t.Fatal(err)
	}
	spec, err := definition.EngineSpec(d)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	cfg.Specs, cfg.Features, cfg.Decoder, cfg.Definition = slices.Clone(spec.Windows), spec, comp.Decoder(), "service-read@x"
	svc, _ := startService(t, cfg)
	if svc.Features() != spec || svc.Definition() != "service-read@x" {
		t.Fatal("Features and Definition are not the configuration's")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The outputs are the definition's records, not VelocityFeatures: wait for every
	// partition's last offset instead of reading them.
	for p := range int32(partitions) {
		last := int64(-1)
		for _, r := range st.Records {
			if r.Partition == p {
				last++
			}
		}
		waitProcessed(t, ctx, svc, p, last)
	}
	for p := range int32(partitions) {
		ref, err := pipeline.New(pipeline.Config{Topic: inTopic, Partition: p, Specs: cfg.Specs, Watermark: cfg.Watermark, Decoder: comp.Decoder(), Features: spec}, 0)
		if err != nil {
			t.Fatal(err)
		}
		entities := map[string]bool{"never-seen": true}
		var off int64
		for _, r := range st.Records {
			if r.Partition == p {
				ref.Process(pipeline.Record{Topic: inTopic, Partition: p, Offset: off, Key: r.Key, Value: r.Value}, func(*pipeline.Output) {})
				off++
				entities[string(r.Key)] = true
			}
		}
		req := NewReadRequest(0, len(cfg.Specs))
		for ent := range entities {
			req.Items = append(req.Items,
				ReadItem{Entity: ent, UseDefault: true, Row: feature.NewRow(spec)},
				ReadItem{Entity: ent, UseDefault: true, Aggs: make([]window.Agg, len(cfg.Specs))})
		}
		if err := svc.Read(ctx, p, req); err != nil {
			t.Fatalf("partition %d: %v", p, err)
		}
		want := feature.NewRow(spec)
		aggs := make([]window.Agg, len(cfg.Specs))
		for i := 0; i < len(req.Items); i += 2 {
			it, lk := &req.Items[i], &req.Items[i+1]
			info, err := ref.LookupFeatures(it.Entity, 0, true, want)
			if err != nil || it.Err != nil || lk.Err != nil {
				t.Fatalf("partition %d %s: %v / %v / %v", p, it.Entity, err, it.Err, lk.Err)
			}
			if it.Info != info || !slices.Equal(it.Row.Values, want.Values) || !slices.Equal(it.Row.Null, want.Null) || !slices.Equal(it.Row.Exact, want.Exact) {
				t.Fatalf("partition %d %s: served %+v %v %v %v, processor %+v %v %v %v", p, it.Entity,
					it.Info, it.Row.Values, it.Row.Null, it.Row.Exact, info, want.Values, want.Null, want.Exact)
			}
			if _, err := ref.Lookup(it.Entity, 0, true, aggs); err != nil || !slices.Equal(lk.Aggs, aggs) {
				t.Fatalf("partition %d %s: windows %v, processor %v (%v)", p, it.Entity, lk.Aggs, aggs, err)
			}
			if it.Info.Known != (it.Entity != "never-seen") {
				t.Fatalf("partition %d %s: known %v", p, it.Entity, it.Info.Known)
			}
		}
	}
}

// waitProcessed waits until partition p's worker has processed offset last.
func waitProcessed(t *testing.T, ctx context.Context, svc *Service, p int32, last int64) {
	t.Helper()
	req := NewReadRequest(1, len(svc.Specs()))
	for {
		req.Items[0] = ReadItem{Entity: "x", UseDefault: true, Aggs: req.Items[0].Aggs}
		if err := svc.Read(ctx, p, req); err == nil && req.Items[0].Info.LastOffset == last {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("partition %d did not process offset %d in time", p, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReadFeaturesWithoutDefinition: the default contract has no features to serve.
func TestReadFeaturesWithoutDefinition(t *testing.T) {
	brokers := newCluster(t, 1)
	st := streamtest.Generate(inTopic, 8, 50, 1)
	produce(t, brokers, st.Records)
	cfg := testConfig(t, brokers, checkpoint.NewMemoryStore())
	svc, _ := startService(t, cfg)
	readOutputs(t, brokers, len(st.Records), time.Minute)
	if svc.Features() != nil {
		t.Fatal("Features without a definition")
	}
	req := NewReadRequest(1, len(cfg.Specs))
	req.Items[0].Entity, req.Items[0].UseDefault, req.Items[0].Row = "card-1", true, &feature.Row{}
	if err := svc.Read(context.Background(), 0, req); err != nil || !errors.Is(req.Items[0].Err, pipeline.ErrNoFeatures) {
		t.Fatalf("read %v, item %v; want ErrNoFeatures", err, req.Items[0].Err)
	}
}
