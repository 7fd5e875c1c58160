package service

import (
	"context"
	"sync"
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

	mu      sync.Mutex
	waiting []lsoAsk
	running bool // a loop is sending requests; it sends another while any ask waits
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
