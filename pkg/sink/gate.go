package sink

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Gate is a Producer that can hold records back: while held, Produce keeps
// each record in memory instead of handing it on, and Release hands them on in
// the order they came, then lets the following records through directly.
//
// It is what lets an exactly-once partition go on processing while its
// transaction commits. The records produced after a checkpoint's cut belong to
// the next transaction, which cannot begin before the current one ends: the
// partition holds the gate at the cut and releases it once the next
// transaction has begun. A record held is not produced: should the commit
// fail, the partition drops the gate with what it holds, and those outputs are
// made again from the committed state by whoever resumes it.
//
// A Gate is not safe for concurrent use: Produce, Hold and Release must come
// from one goroutine (the partition's), or be ordered by the caller.
type Gate struct {
	prod Producer
	hold bool
	held []heldRecord
}

type heldRecord struct {
	r       *kgo.Record
	promise func(*kgo.Record, error)
}

// NewGate returns an open gate in front of prod.
func NewGate(prod Producer) *Gate { return &Gate{prod: prod} }

// Produce hands r on, or keeps it while the gate is held. The context of a
// held record is not kept: the sink's records carry their own (see pending),
// and Release produces with context.Background.
func (g *Gate) Produce(ctx context.Context, r *kgo.Record, promise func(*kgo.Record, error)) {
	if g.hold {
		g.held = append(g.held, heldRecord{r, promise})
		return
	}
	g.prod.Produce(ctx, r, promise)
}

// Hold makes Produce keep the records from now on.
func (g *Gate) Hold() { g.hold = true }

// Release hands on every record held, in order, and opens the gate.
func (g *Gate) Release() {
	g.hold = false
	for i, h := range g.held {
		g.prod.Produce(context.Background(), h.r, h.promise)
		g.held[i] = heldRecord{}
	}
	g.held = g.held[:0] // the capacity stays for the next hold
}

// Held is how many records the gate holds.
func (g *Gate) Held() int { return len(g.held) }
