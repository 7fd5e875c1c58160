package replay

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/pipeline"
	"github.com/velocity-consumer/velocity-consumer/pkg/sink"
)

// fakeProducer acknowledges (or fails) every record at once and keeps copies.
type fakeProducer struct {
	mu   sync.Mutex
	recs []kgo.Record
	fail error
}

func (f *fakeProducer) Produce(_ context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	f.mu.Lock()
	c := *r
	c.Key = append([]byte(nil), r.Key...)
	c.Value = append([]byte(nil), r.Value...)
	c.Headers = append([]kgo.RecordHeader(nil), r.Headers...)
	f.recs = append(f.recs, c)
	f.mu.Unlock()
	promise(r, f.fail)
}

func headers(r kgo.Record) map[string]string {
	m := map[string]string{}
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

// TestKafkaSink checks the records a topic output produces: features to the
// features topic keyed by entity with the live service's headers, dead letters
// to the DLQ topic with the original bytes and the contract's headers, and
// that a failed produce stops the replay instead of being lost.
func TestKafkaSink(t *testing.T) {
	feat := &pipeline.Output{Key: []byte("card-A"), Value: []byte{1, 2, 3}, SourceTopic: "tx", SourcePartition: 2, SourceOffset: 7}
	dead := &pipeline.Output{Dead: true, Key: []byte("k"), Value: []byte{9}, Reason: codec.ReasonLate, Err: "behind",
		SourceTopic: "tx", SourcePartition: 2, SourceOffset: 8}
	tests := []struct {
		name      string
		dlq       string
		outs      []*pipeline.Output
		fail      error
		wantErr   string
		wantTopic []string
	}{
		{"features and dead letters", "dlq", []*pipeline.Output{feat, dead}, nil, "", []string{"features", "dlq"}},
		{"dead letter without a DLQ topic", "", []*pipeline.Output{dead}, nil, "no DLQ topic", nil},
		{"produce failure", "dlq", []*pipeline.Output{feat}, errors.New("broker says no"), "broker says no", []string{"features"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fp := &fakeProducer{fail: tt.fail}
			k := &KafkaSink{prod: fp, host: "replay-host"}
			k.SetFeaturesTopic("features")
			k.SetDLQTopic(tt.dlq)
			var err error
			for _, o := range tt.outs {
				if err = k.Write(o); err != nil {
					break
				}
			}
			if err == nil {
				err = k.Commit(context.Background())
			}
			if (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want %q", err, tt.wantErr)
			}
			var topics []string
			for _, r := range fp.recs {
				topics = append(topics, r.Topic)
			}
			if strings.Join(topics, ",") != strings.Join(tt.wantTopic, ",") {
				t.Fatalf("produced to %v, want %v", topics, tt.wantTopic)
			}
			for _, r := range fp.recs {
				h := headers(r)
				switch r.Topic {
				case "features":
					if string(r.Key) != "card-A" || string(r.Value) != "\x01\x02\x03" || h[sink.HeaderHost] != "replay-host" || h[sink.HeaderEmittedAt] == "" {
						t.Errorf("features record %+v headers %v", r, h)
					}
				case "dlq":
					want := map[string]string{codec.HeaderReason: "late", codec.HeaderError: "behind", codec.HeaderSourceTopic: "tx",
						codec.HeaderSourcePartition: "2", codec.HeaderSourceOffset: "8"}
					for k, v := range want {
						if h[k] != v {
							t.Errorf("dead letter header %s = %q, want %q", k, h[k], v)
						}
					}
					if string(r.Key) != "k" || string(r.Value) != "\x09" {
						t.Errorf("dead letter bytes %q %q, want the originals", r.Key, r.Value)
					}
				}
			}
		})
	}
}

// TestKafkaSinkFeaturesPrefix checks that with a schema registry's prefix the
// features values carry it, as the live service's do, and dead letters keep
// the source bytes.
func TestKafkaSinkFeaturesPrefix(t *testing.T) {
	fp := &fakeProducer{}
	k := &KafkaSink{prod: fp}
	k.SetFeaturesTopic("features")
	k.SetDLQTopic("dlq")
	k.SetFeaturesPrefix([]byte{0, 0, 0, 0, 42})
	for _, o := range []*pipeline.Output{
		{Key: []byte("e"), Value: []byte{7, 8}},
		{Dead: true, Key: []byte("e"), Value: []byte{9}, Reason: codec.ReasonDecode},
	} {
		if err := k.Write(o); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(fp.recs) != 2 || string(fp.recs[0].Value) != "\x00\x00\x00\x00\x2a\x07\x08" || string(fp.recs[1].Value) != "\x09" {
		t.Fatalf("values %q, want the prefix on the features value only", [][]byte{fp.recs[0].Value, fp.recs[1].Value})
	}
}
