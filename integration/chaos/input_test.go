//go:build integration

package chaos

import (
	"context"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
)

// The input's shape.
const (
	partitions       = 4
	entitiesPerPart  = 300
	allowedLateness  = time.Second
	maxRecordBytes   = 2048 // --max-record-bytes, so that oversized records are cheap to make
	genHeader        = "chaos.gen"
	inputBaseEventMs = 1_795_000_000_000 // 2026-11-18T07:06:40Z; the seed adds up to a day
)

// generator makes a seeded input stream. Each entity lives in one partition
// (its key hashes there). Out-of-order input is of four kinds: records behind
// the partition's newest accepted event by less than the lateness
// ("in-lateness": accepted, and counted before the newer events the reorder
// buffer holds with them), records late on every reading (more than the
// lateness behind), duplicates of accepted events, and records that never move
// the watermark (undecodable, invalid, oversized). An idle release (the one
// wall-clock effect, which replay never makes) between an in-lateness record
// and the newer ones before it makes the live run count it out of order; how
// far that may change the outputs, the checks bound (idle_test.go).
//
// Across partitions, every burst starts all partitions' clocks together, a gap
// past the newest event time of any partition (align): so a quiet phase, after
// which the idle rule has let a re-keyed group's second stage release everything
// (docs/repartition.md), is never followed by an event older than what it
// released, and a second stage's outputs, like an input partition's, cannot depend
// on when the idle timeout fired. Within a burst the partitions' clocks drift
// apart as they will, which only the second stages' order settles.
//
// The input's event times span far less than the largest window (24 h) and
// the dedupe horizon, and record timestamps equal event times, so a warm-up
// read (an instance with no usable snapshot) covers the whole partition and
// restores the state exactly: a value that differs from replay is a bug, not
// a documented limit of the warm-up.
type generator struct {
	rng      *rand.Rand
	entities [partitions][]string
	clock    [partitions]int64 // newest accepted event time; 0 = none yet
	fresh    [partitions]bool  // align moved the clock: the next record is a valid one at it
	sent     [partitions][]*kgo.Record
	// seq numbers the records (their ids); atomic, as the querier's
	// goroutines read it (the preview's event ids).
	seq   atomic.Int64
	kinds map[string]int
	// wire, in a registry run, frames the values in the Confluent wire format
	// (nil: plain Avro).
	wire *wireFormat
	// txs is, by the id of the chaos.gen header, the transaction each record
	// carries that decodes as one (whatever the service then makes of it): what
	// the query API's answers are computed from (apicheck_test.go), the
	// generator's own amounts and event times rather than any output's.
	txs map[string]genTx
}

// wireFormat frames a registry run's values: a magic byte 0, a schema id,
// the Avro body. Half the transactions are written with the Transaction
// schema (v1), half with a later version of it (v2: one more field, an
// optional string, null here, so its body is v1's and one byte 0), which the
// service must resolve to the Transaction it reads. unknown is an id the
// registry does not have: such values are decode dead letters. rng is its own,
// so that the records are the same as without a registry, but for the framing.
type wireFormat struct {
	v1, v2, unknown int
	rng             *rand.Rand
}

// encode is tx's value: plain Avro without a wire format (w nil).
func (w *wireFormat) encode(tx *codec.Transaction) []byte {
	if w == nil {
		return codec.EncodeTransaction(tx)
	}
	if w.rng.IntN(2) == 0 {
		return codec.AppendTransaction(registry.AppendHeader(nil, w.v1), tx)
	}
	return append(codec.AppendTransaction(registry.AppendHeader(nil, w.v2), tx), 0)
}

// genTx is the transaction of one generated record, as the generator made it.
type genTx struct {
	eventID, entity, currency string
	amount, time              int64
}

func txOf(tx *codec.Transaction) genTx {
	return genTx{eventID: tx.EventID, entity: tx.EntityID, currency: tx.Currency, amount: tx.AmountMinor, time: tx.EventTime}
}

// genID is the generator's id of a record from its chaos.gen header ("<kind> <id>").
func genID(header string) string {
	_, id, _ := strings.Cut(header, " ")
	return id
}

func newGenerator(seed uint64) *generator {
	g := &generator{rng: rand.New(rand.NewPCG(seed, 0x696e707574)), kinds: map[string]int{}, txs: map[string]genTx{}}
	for i := 0; ; i++ {
		e := fmt.Sprintf("card-%06d", i)
		h := fnv.New32a()
		h.Write([]byte(e))
		p := h.Sum32() % partitions
		if len(g.entities[p]) < entitiesPerPart {
			g.entities[p] = append(g.entities[p], e)
		}
		full := true
		for _, es := range g.entities {
			full = full && len(es) == entitiesPerPart
		}
		if full {
			break
		}
	}
	base := inputBaseEventMs + g.rng.Int64N(24*3600*1000)
	for p := range g.clock {
		g.clock[p] = base
	}
	return g
}

func (g *generator) entity(p int) string {
	es := g.entities[p]
	if g.rng.IntN(2) == 0 {
		return es[g.rng.IntN(10)] // hot entities
	}
	return es[g.rng.IntN(len(es))]
}

// next returns the next input record, its partition set.
func (g *generator) next() *kgo.Record {
	p := g.rng.IntN(partitions)
	started := g.sent[p] != nil
	id := fmt.Sprintf("ev-%08d", g.seq.Add(1))
	ent := g.entity(p)
	valid := func(t int64) *codec.Transaction {
		return &codec.Transaction{EventID: id, EntityID: ent, AmountMinor: g.rng.Int64N(50_000), Currency: []string{"EUR", "USD", ""}[g.rng.IntN(3)], EventTime: t}
	}
	// rec makes the record; tx is the transaction its value encodes (nil: none).
	rec := func(kind string, key []byte, tx *codec.Transaction, value []byte, t int64) *kgo.Record {
		g.kinds[kind]++
		if tx != nil {
			g.txs[id] = txOf(tx)
		}
		return &kgo.Record{
			Key: key, Value: value, Partition: int32(p), Timestamp: time.UnixMilli(t),
			Headers: []kgo.RecordHeader{{Key: genHeader, Value: []byte(kind + " " + id)}},
		}
	}
	x := g.rng.IntN(1000)
	enc := func(kind string, key []byte, tx *codec.Transaction, t int64) *kgo.Record {
		return rec(kind, key, tx, g.wire.encode(tx), t)
	}
	switch {
	case started && !g.fresh[p] && x < 40:
		// Behind the partition's newest accepted event by less than the
		// lateness: not late, held in the reorder buffer while newer events are
		// released around it, and counted in (event time, offset) order.
		t := g.clock[p] - 1 - g.rng.Int64N(allowedLateness.Milliseconds()-1)
		r := enc("in-lateness", []byte(ent), valid(t), t)
		g.sent[p] = append(g.sent[p], r)
		return r
	case !started || g.fresh[p] || x < 860:
		g.fresh[p] = false
		g.clock[p] += g.rng.Int64N(25) // 0 too: equal event times, ordered by offset
		r := enc("valid", []byte(ent), valid(g.clock[p]), g.clock[p])
		g.sent[p] = append(g.sent[p], r)
		if len(g.sent[p]) > 2000 {
			g.sent[p] = g.sent[p][1:]
		}
		return r
	case x < 890: // a resend of an accepted event: a duplicate
		old := g.sent[p][g.rng.IntN(len(g.sent[p]))]
		r := rec("duplicate", old.Key, nil, old.Value, g.clock[p])
		g.txs[id] = g.txs[genID(string(old.Headers[0].Value))]
		return r
	case x < 920: // behind the watermark by more than the lateness: late
		t := g.clock[p] - allowedLateness.Milliseconds() - 1 - g.rng.Int64N(30_000)
		r := enc("late", []byte(ent), valid(t), t)
		// Resent like the accepted ones: under --late=apply a late event
		// counted is remembered by dedupe, and its resend is a duplicate.
		g.sent[p] = append(g.sent[p], r)
		return r
	case x < 935:
		if g.wire != nil && g.wire.rng.IntN(2) == 0 {
			// A transaction framed with an id the registry does not have.
			v := registry.AppendHeader(nil, g.wire.unknown)
			tx := codec.Transaction{EventID: id, EntityID: ent, AmountMinor: 1, Currency: "EUR", EventTime: g.clock[p]}
			return rec("unknown-schema", []byte(ent), nil, codec.AppendTransaction(v, &tx), g.clock[p])
		}
		return rec("undecodable", []byte(ent), nil, []byte("not avro: "+id), g.clock[p])
	case x < 940:
		return rec("tombstone", []byte(ent), nil, nil, g.clock[p])
	case x < 945:
		return rec("empty", []byte(ent), nil, []byte{}, g.clock[p])
	case x < 960:
		tx := valid(g.clock[p])
		tx.AmountMinor = -1 - g.rng.Int64N(1000)
		return enc("negative-amount", []byte(ent), tx, g.clock[p])
	case x < 967:
		tx := valid(g.clock[p])
		tx.EventID = ""
		return enc("empty-event-id", []byte(ent), tx, g.clock[p])
	case x < 974:
		tx := valid(g.clock[p])
		tx.Currency = "euro"
		return enc("bad-currency", []byte(ent), tx, g.clock[p])
	case x < 980: // more than --max-ahead (24 h) ahead of the partition: invalid, never accepted
		t := g.clock[p] + 25*3600*1000
		return enc("far-ahead", []byte(ent), valid(t), g.clock[p])
	case x < 985:
		tx := valid(g.clock[p])
		tx.Currency = strings.Repeat("X", maxRecordBytes) // oversized: too_large comes first
		return enc("too-large", []byte(ent), tx, g.clock[p])
	default: // keyed by another entity of the partition: processed as usual
		g.clock[p] += g.rng.Int64N(25)
		r := enc("key-mismatch", []byte(g.entity(p)+"-x"), valid(g.clock[p]), g.clock[p])
		g.sent[p] = append(g.sent[p], r)
		return r
	}
}

// alignGap is how far past the newest event time of every partition align moves
// the clocks: beyond the lateness, so nothing accepted after it sorts before
// anything accepted before it on any partition.
const alignGap = allowedLateness + time.Second

// align moves every partition's clock to alignGap past the newest of them, and
// makes each partition's next record a valid one at its new clock: until one is
// accepted the partition's watermark is still the old one, and a record made
// "late" from the new clock would not be late.
func (g *generator) align() {
	var newest int64
	for _, c := range g.clock {
		newest = max(newest, c)
	}
	for p := range g.clock {
		g.clock[p] = newest + alignGap.Milliseconds()
		g.fresh[p] = true
	}
}

// producer writes input records to the input topic, in generation order per
// partition (one idempotent client), riding out a broker restart.
type producer struct {
	cl    *kgo.Client
	gen   *generator
	total int
}

// burst produces n records spread evenly over d, in batches every 50 ms, and
// returns when all are acknowledged. A broker outage stretches it, and so does
// a pause: after pauseAt of the burst's time (if pause > 0) it stops for pause,
// then goes on from the same clocks. paused, if not nil, gets the moment the
// pause begins (the input has stopped: the last batch before it is
// acknowledged), and is closed when the burst returns.
func (pr *producer) burst(ctx context.Context, n int, d, pauseAt, pause time.Duration, paused chan<- time.Time) error {
	if paused != nil {
		defer close(paused)
	}
	pr.gen.align()
	const tick = 50 * time.Millisecond
	steps := max(1, int(d/tick))
	begin := time.Now()
	done := 0
	for s := 1; s <= steps; s++ {
		if pause > 0 && time.Duration(s)*tick > pauseAt {
			if paused != nil {
				paused <- time.Now() // buffered: its one value
			}
			select {
			case <-time.After(pause):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			begin = begin.Add(pause)
			pause = 0
		}
		upto := n * s / steps
		batch := make([]*kgo.Record, 0, upto-done)
		for ; done < upto; done++ {
			batch = append(batch, pr.gen.next())
		}
		bctx, cancel := context.WithTimeout(ctx, 3*time.Minute) // a broker restart takes seconds
		sent := time.Now()
		err := produceRetrying(bctx, pr.cl, batch)
		cancel()
		if err != nil {
			return err
		}
		// A batch held up past the idle timeout (a broker outage) ends the
		// burst's alignment: the partitions may have been declared idle
		// meanwhile, and a re-keyed group's second stage, with every source
		// idle, has let its order pass the fastest source's newest event, so
		// the rest of the burst starts past it, as a new burst would.
		if time.Since(sent) > idleTimeout {
			pr.gen.align()
		}
		pr.total += len(batch)
		if wait := time.Until(begin.Add(time.Duration(s) * tick)); wait > 0 {
			time.Sleep(wait)
		}
	}
	return nil
}

// produceRetrying produces batch and produces again, after a second, the records
// the client failed, until every record is acknowledged or ctx ends. After a slow
// broker restart the client can fail records with "unable to initialize a producer
// ID" although the broker is back a moment later; the run must not end for that.
// A record produced again may land twice or after later ones: the checks judge the
// outputs by what the input topic holds (a replay of it), so that is more input,
// not a wrong verdict.
func produceRetrying(ctx context.Context, cl *kgo.Client, batch []*kgo.Record) error {
	for {
		var mu sync.Mutex
		var failed []*kgo.Record
		var last error
		var wg sync.WaitGroup
		wg.Add(len(batch))
		for _, r := range batch {
			cl.Produce(ctx, r, func(r *kgo.Record, err error) {
				defer wg.Done()
				if err != nil {
					mu.Lock()
					failed, last = append(failed, r), err
					mu.Unlock()
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("produce: %d records unacknowledged: %w", len(batch), context.Cause(ctx))
		}
		if len(failed) == 0 {
			return nil
		}
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			return fmt.Errorf("produce: %d records failed, the last with %v: %w", len(failed), last, context.Cause(ctx))
		}
		batch = failed // each keeps its partition (the manual partitioner)
	}
}
