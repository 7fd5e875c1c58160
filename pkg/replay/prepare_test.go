package replay

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// flakyDecoder is a codec.Decoder whose Prepare fails a number of times per
// value before it succeeds, like a schema-registry decoder during an outage.
type flakyDecoder struct {
	codec.Decoder
	mu                sync.Mutex
	failures          int // per value
	seen              map[string]int
	prepared          map[string]bool
	decodedUnprepared bool
}

var errRegistryDown = errors.New("registry unreachable")

func (d *flakyDecoder) Prepare(_ context.Context, value []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.seen[string(value)]++; d.seen[string(value)] <= d.failures {
		return errRegistryDown
	}
	d.prepared[string(value)] = true
	return nil
}

func (d *flakyDecoder) Decode(value []byte, maxSeen int64, hasMax bool, tx *codec.Transaction) *codec.Rejection {
	d.mu.Lock()
	if !d.prepared[string(value)] {
		d.decodedUnprepared = true
	}
	d.mu.Unlock()
	return d.Decoder.Decode(value, maxSeen, hasMax, tx)
}

// TestPreparerWaitsInsteadOfDeadLettering checks that a decoder that is not
// ready (a registry outage) makes the replay wait and retry, never decode an
// unprepared value or dead-letter it, and that the outputs are then those of
// a replay without the outage; and that an outage longer than
// MaxPrepareWait stops the replay with an error naming the offset.
func TestPreparerWaitsInsteadOfDeadLettering(t *testing.T) {
	defer func(b time.Duration) { minPrepareBackoff = b }(minPrepareBackoff)
	minPrepareBackoff = time.Millisecond
	want := replayToMem(t, mustOpenJSONL(t, filepath.Join("testdata", "examples.jsonl")))
	tests := []struct {
		name     string
		failures int
		maxWait  time.Duration
		wantErr  string
	}{
		{"ready at once", 0, time.Second, ""},
		{"two failures per record", 2, 5 * time.Second, ""},
		{"longer than the wait", 1 << 30, 100 * time.Millisecond, "offset 0: the decoder could not prepare it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pc := exampleConfig(t)
			dec := &flakyDecoder{Decoder: pc.Decoder, failures: tt.failures, seen: map[string]int{}, prepared: map[string]bool{}}
			pc.Decoder = dec
			m := &memSink{}
			retries := 0
			_, err := Run(context.Background(), mustOpenJSONL(t, filepath.Join("testdata", "examples.jsonl")), Config{
				Pipeline: pc, Features: m, Dead: m, MaxPrepareWait: tt.maxWait,
				OnPrepareRetry: func(p int32, off int64, attempt int, err error) {
					retries++
					if !errors.Is(err, errRegistryDown) {
						t.Errorf("retry hook got %v", err)
					}
				},
			})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, errRegistryDown) {
					t.Fatalf("err = %v, want %q wrapping the decoder's error", err, tt.wantErr)
				}
				if len(m.values)+len(m.dead) != 0 {
					t.Errorf("%d outputs before the first record was ready", len(m.values)+len(m.dead))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if dec.decodedUnprepared {
				t.Error("a value was decoded before its Prepare succeeded")
			}
			// 11 distinct values (e2's resend has the same bytes), each
			// failing tt.failures times first.
			if tt.failures > 0 && retries < tt.failures*11 {
				t.Errorf("%d retries, want at least %d", retries, tt.failures*11)
			}
			if len(m.values) != len(want.values) || len(m.dead) != len(want.dead) {
				t.Fatalf("%d features %d dead, want %d and %d", len(m.values), len(m.dead), len(want.values), len(want.dead))
			}
			for i := range want.values {
				if string(m.values[i]) != string(want.values[i]) {
					t.Errorf("features %d differ from a replay without the outage", i)
				}
			}
		})
	}
}
