package sink

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestGateHoldsInOrder: records produced while the gate is held reach the
// producer only at Release, in the order they came, and before any record
// produced after it; an open gate passes records straight through.
func TestGateHoldsInOrder(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		before, during, post int
	}{
		{"nothing held", 3, 0, 2},
		{"held between two open spells", 2, 5, 3},
		{"held from the start", 0, 4, 1},
		{"more than one slab", 1, 2*slabLen + 7, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := &fakeProducer{}
			g := NewGate(fp)
			tr := New(g, "out", "dlq", "h").NewTracker(nil)
			n := 0
			produce := func(k int) {
				for range k {
					tr.Features(fmt.Appendf(nil, "k%d", n), []byte{byte(n)}, 1)
					n++
				}
			}
			produce(tc.before)
			if len(fp.got) != tc.before {
				t.Fatalf("open gate: producer got %d of %d", len(fp.got), tc.before)
			}
			g.Hold()
			produce(tc.during)
			if len(fp.got) != tc.before || g.Held() != tc.during {
				t.Fatalf("held gate: producer got %d (want %d), gate holds %d (want %d)", len(fp.got), tc.before, g.Held(), tc.during)
			}
			g.Release()
			if g.Held() != 0 {
				t.Fatalf("after release the gate holds %d", g.Held())
			}
			produce(tc.post)
			if len(fp.got) != n {
				t.Fatalf("producer got %d of %d", len(fp.got), n)
			}
			for i, r := range fp.got {
				if want := fmt.Sprintf("k%d", i); string(r.Key) != want {
					t.Fatalf("record %d has key %q, want %q: out of order", i, r.Key, want)
				}
			}
			fp.settle(nil)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := tr.Flush(ctx); err != nil {
				t.Fatalf("flush after every record was acknowledged: %v", err)
			}
		})
	}
}

// TestGateCutExcludesHeldRecords: a cut taken as the gate is held seals the
// records produced before it, whose acknowledgements end its epoch, while the
// records held after it stay in flight (counted in PendingBytes, so
// backpressure sees them) until they are released and acknowledged. This is
// what an exactly-once checkpoint waits on while the partition goes on.
func TestGateCutExcludesHeldRecords(t *testing.T) {
	fp := &fakeProducer{}
	g := NewGate(fp)
	tr := New(g, "out", "dlq", "h").NewTracker(nil)
	tr.Features([]byte("a"), []byte{1}, 1)
	tr.Features([]byte("b"), []byte{2}, 1)
	g.Hold()
	ep := tr.Cut()
	tr.Features([]byte("c"), []byte{3}, 1)
	if got := tr.PendingBytes(); got != 6 {
		t.Fatalf("pending bytes %d, want 6 (two sent, one held)", got)
	}
	fp.settle(nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := ep.Wait(ctx); err != nil {
		t.Fatalf("the cut's epoch did not end with its two records acknowledged: %v", err)
	}
	if got := tr.PendingBytes(); got != 2 {
		t.Fatalf("pending bytes %d after the acks, want 2 (the held record)", got)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancelShort()
	if err := tr.Flush(short); !errors.Is(err, ErrFlushTimeout) {
		t.Fatalf("flush with a record held: %v, want ErrFlushTimeout", err)
	}
	g.Release()
	if len(fp.got) != 3 || string(fp.got[2].Key) != "c" {
		t.Fatalf("after release the producer has %d records", len(fp.got))
	}
	fp.settle(nil)
	if err := tr.Flush(ctx); err != nil {
		t.Fatalf("flush after the release: %v", err)
	}
}
