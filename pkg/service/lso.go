package service

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
)

// lsoLookup asks the broker for the input topic's last stable offsets on
// behalf of every partition's idle verdict (worker.idleVerdict) at once.
// ListCommittedOffsets lists every partition of the topic anyway, so one
// request serves every partition waiting for an answer. The states that keep
// partitions asking, quiet but with records left at the broker (a poll loop
// held up, a broker down or restarting), are the ones every partition of an
// instance is in together: a request per partition per tick would arrive at a
// broker coming back from a restart all at once.
//
// Invariant: an answer reaches only the askers registered before its request
// was sent. An idle verdict compares the answer with what its partition had
// read when it asked; an answer listed before the question could predate
// records the partition has not read yet, and the partition would be released
// with them still to come.
type lsoLookup struct {
	list func(ctx context.Context) (kadm.ListedOffsets, error)
	// run starts the loop on a goroutine that shutdown waits for (Service.bg).
	run   func(func())
	topic string
	// every spaces the requests: the questions asked in between wait for the
	// next one, which answers them together. The workers' tick (they ask at
	// most once a tick each), so that a verdict waits at most one tick more.
	every time.Duration

	// committed, when set, lists the input group's committed offsets with each
	// request, so that the answers also say when the input was last seen active
	// (activity): the first stages of re-keyed groups renew their idle leases
	// only then (worker.renewalsWanted).
	committed func(ctx context.Context) (kadm.OffsetResponses, error)

	mu      sync.Mutex
	waiting []lsoAsk
	running bool // a loop is sending requests; it sends another while any ask waits

	// ends are the end offsets of the last request that listed them (loop
	// only); activeAt is when a request last found the input active, in Unix
	// nanoseconds (0: never), read by the workers (renewalsWanted).
	ends     map[int32]int64
	activeAt atomic.Int64
}

// lsoAsk is one partition's question: its answer goes to out (buffered, and
// the partition asks again only once it has the answer) with q.
type lsoAsk struct {
	part int32
	q    idleQuestion
	out  chan<- idleAnswer
}

// lsoTimeout bounds one request: a broker that does not answer delays the
// verdicts (they ask again), never the partitions.
const lsoTimeout = 5 * time.Second

// ask registers a question; the answer arrives on a.out.
func (l *lsoLookup) ask(a lsoAsk) {
	l.mu.Lock()
	l.waiting = append(l.waiting, a)
	start := !l.running
	l.running = true
	l.mu.Unlock()
	if start {
		l.run(l.loop)
	}
}

// loop sends one request for every question waiting when it is sent, at most
// one every l.every, answers them, and goes on while questions arrived
// meanwhile.
func (l *lsoLookup) loop() {
	var last time.Time
	for {
		if wait := time.Until(last.Add(l.every)); wait > 0 {
			time.Sleep(wait)
		}
		l.mu.Lock()
		batch := l.waiting
		l.waiting = nil
		if len(batch) == 0 {
			l.running = false
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		last = time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), lsoTimeout)
		listed, err := l.list(ctx)
		if l.committed != nil && l.activity(ctx, listed, err) {
			l.activeAt.Store(last.UnixNano())
		}
		cancel()
		for _, a := range batch {
			end := int64(-1)
			if err == nil {
				if o, ok := listed.Lookup(l.topic, a.part); ok && o.Err == nil {
					end = o.Offset
				}
			}
			a.out <- idleAnswer{a.q, end}
		}
	}
}

// activity reports whether the input may have had records to process since the
// previous request, or has some now: a partition's end offset moved, or some
// partition's committed offset is below its end (records not yet read, or read
// but not yet checkpointed). Whatever it cannot tell (a failed request, a
// partition missing from an answer, the first request) counts as activity, so a
// doubt costs renewals, never a renewal that was needed. A transactional
// producer's last commit marker keeps a partition's committed offset below its
// end for good; the renewals then never wait, as before.
func (l *lsoLookup) activity(ctx context.Context, listed kadm.ListedOffsets, err error) bool {
	if err != nil {
		return true
	}
	ends := make(map[int32]int64, len(l.ends))
	active := l.ends == nil
	listed.Each(func(o kadm.ListedOffset) {
		if o.Topic != l.topic || o.Err != nil {
			return
		}
		ends[o.Partition] = o.Offset
		if prev, ok := l.ends[o.Partition]; !ok || prev != o.Offset {
			active = true
		}
	})
	// A partition this answer lacks, or has an error for, keeps its last end,
	// and is activity for as long as it is missing.
	for p, end := range l.ends {
		if _, ok := ends[p]; !ok {
			ends[p] = end
			active = true
		}
	}
	if len(ends) == 0 {
		active = true
	}
	l.ends = ends
	if active {
		return true
	}
	committed, err := l.committed(ctx)
	if err != nil {
		return true
	}
	for p, end := range ends {
		c, ok := committed.Lookup(l.topic, p)
		if end > 0 && (!ok || c.Err != nil || c.At < end) {
			return true
		}
	}
	return false
}
