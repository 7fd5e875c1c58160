package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Workload is a fixed, seeded stream of transactions: the same parameters give the same
// entities, amounts, event ids and disorder, so every processor in a comparison reads
// identical input and a rerun reproduces it.
type Workload struct {
	Seed     uint64
	Events   int
	Entities int // entity ids card-0000000 … card-<Entities-1>, Zipf-distributed
	// ZipfS and ZipfV are math/rand's Zipf parameters: P(rank k) ∝ (ZipfV+k)^−ZipfS.
	// s=1.1, v=10 puts ~1.7 % of events on the hottest card of 100 000 and leaves a
	// long tail seen once or twice, which is the shape of card traffic.
	ZipfS, ZipfV float64
	// OutOfOrder is the fraction of events whose event time is moved back by 1 …
	// MaxDisorderMs relative to their position in the stream.
	OutOfOrder    float64
	MaxDisorderMs int64
	// StartMs and StepMicros place event i at StartMs + i*StepMicros/1000 (before
	// disorder) for workloads produced ahead of the run; paced runs use wall time.
	StartMs    int64
	StepMicros int64
	// Format is the records' schema: "" for our Transaction (schemas/transaction.avsc),
	// FormatPayments for testdata/payment_event.avsc (payments.go), the same events
	// with a device and an IP for the groups benchmark.
	Format string
}

// DefaultWorkload is the comparison's workload over the given number of entities: 1 % of events
// up to 2 s out of order, and an event time that advances 3.6 ms per event, so 1 M events
// span one hour (every window, up to 24 h, fills and the short ones turn over).
func DefaultWorkload(entities, events int) Workload {
	return Workload{
		Seed:          9,
		Events:        events,
		Entities:      entities,
		ZipfS:         1.1,
		ZipfV:         10,
		OutOfOrder:    0.01,
		MaxDisorderMs: 2000,
		StartMs:       1_798_761_600_000, // 2027-01-01T00:00:00Z: fixed, so reruns match
		StepMicros:    3600,
	}
}

// Validate names the first parameter that cannot generate a stream.
func (w Workload) Validate() error {
	switch {
	case w.Events <= 0:
		return fmt.Errorf("workload: events %d must be > 0", w.Events)
	case w.Entities <= 1:
		return fmt.Errorf("workload: entities %d must be > 1", w.Entities)
	case w.ZipfS <= 1 || w.ZipfV < 1:
		return fmt.Errorf("workload: zipf s=%g v=%g needs s > 1 and v >= 1", w.ZipfS, w.ZipfV)
	case w.OutOfOrder < 0 || w.OutOfOrder > 1:
		return fmt.Errorf("workload: out-of-order fraction %g must be in [0, 1]", w.OutOfOrder)
	case w.OutOfOrder > 0 && w.MaxDisorderMs < 1:
		return fmt.Errorf("workload: max disorder %d ms must be >= 1", w.MaxDisorderMs)
	case w.StepMicros < 0:
		return fmt.Errorf("workload: step %d µs must be >= 0", w.StepMicros)
	case w.Format != "" && w.Format != FormatPayments:
		return fmt.Errorf("workload: format %q is neither transactions (\"\") nor %q", w.Format, FormatPayments)
	}
	return nil
}

// Event is one generated transaction before it gets an event time. DisorderMs is how
// far its event time lies behind its position in the stream (0 for in-order events).
type Event struct {
	ID         [36]byte // UUID-shaped, as real event ids are
	Entity     uint32
	AmountMin  int64
	Currency   string
	DisorderMs int64
}

// Generator yields a Workload's events in stream order.
type Generator struct {
	w    Workload
	r    *rand.Rand
	zipf *rand.Zipf
	// perm scatters Zipf ranks over entity ids (rank·perm mod n, perm coprime with n),
	// so the hottest cards are not card-0000000, -1, -2 and do not share a prefix.
	perm uint64
	i    int
}

// NewGenerator starts w's stream at event 0.
func NewGenerator(w Workload) (*Generator, error) {
	if err := w.Validate(); err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(w.Seed, 0x76656c6f63697479)) // "velocity"
	n := uint64(w.Entities)
	perm := uint64(2_654_435_761) % n
	for perm < 2 || gcd(perm, n) != 1 {
		perm++
		if perm >= n {
			perm = 1 // n ≥ 2 and 1 is coprime with everything
			break
		}
	}
	return &Generator{w: w, r: r, zipf: rand.NewZipf(r, w.ZipfS, w.ZipfV, n-1), perm: perm}, nil
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

var currencies = [...]string{"EUR", "EUR", "EUR", "EUR", "USD", "USD", "GBP", "CHF"}

const hexDigits = "0123456789abcdef"

// Next returns the next event; ok=false after Workload.Events events.
func (g *Generator) Next() (ev Event, ok bool) {
	if g.i >= g.w.Events {
		return Event{}, false
	}
	g.i++
	rank := g.zipf.Uint64()
	ev.Entity = uint32(rank * g.perm % uint64(g.w.Entities))
	// Log-normal amounts: median 25.00, a heavy right tail (σ=1.3 gives p99 ≈ 500.00),
	// never zero, capped well inside the contract's 10^15.
	a := math.Exp(math.Log(2500) + 1.3*g.r.NormFloat64())
	ev.AmountMin = int64(min(max(a, 1), 1e9))
	ev.Currency = currencies[g.r.IntN(len(currencies))]
	if g.w.OutOfOrder > 0 && g.r.Float64() < g.w.OutOfOrder {
		ev.DisorderMs = 1 + g.r.Int64N(g.w.MaxDisorderMs)
	}
	hi, lo := g.r.Uint64(), g.r.Uint64()
	var raw [16]byte
	binary.BigEndian.PutUint64(raw[:8], hi)
	binary.BigEndian.PutUint64(raw[8:], lo)
	j := 0
	for i, b := range raw {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			ev.ID[j] = '-'
			j++
		}
		ev.ID[j], ev.ID[j+1] = hexDigits[b>>4], hexDigits[b&15]
		j += 2
	}
	return ev, true
}

// Index is the 0-based position of the event Next returned last.
func (g *Generator) Index() int { return g.i - 1 }

// Record is the Kafka record of the event Next returned last, with eventTime, in the
// workload's Format, keyed by its entity (card) id.
func (g *Generator) Record(ev Event, eventTime int64) *kgo.Record {
	if g.w.Format == FormatPayments {
		return paymentRecord(&g.w, ev, g.Index(), eventTime)
	}
	return record(ev, eventTime)
}

// EventTime is the event time of the i-th event of a workload produced ahead of the run.
func (w Workload) EventTime(i int, disorderMs int64) int64 {
	return w.StartMs + int64(i)*w.StepMicros/1000 - disorderMs
}

// EntityID is the record key and entity_id of entity n.
func EntityID(n uint32) string { return fmt.Sprintf("card-%07d", n) }

// appendEntityID is EntityID without the allocation, for the producer's hot loop.
func appendEntityID(dst []byte, n uint32) []byte {
	dst = append(dst, "card-"...)
	var d [10]byte
	i := len(d)
	for v := n; ; v /= 10 {
		i--
		d[i] = byte('0' + v%10)
		if v < 10 {
			break
		}
	}
	for pad := len(d) - i; pad < 7; pad++ {
		dst = append(dst, '0')
	}
	return append(dst, d[i:]...)
}

// The event-sequence file shared with bench/python/seed_window.py and the Go benchmark
// in seq_test.go: a 16-byte header ("VBSEQ001" + little-endian uint64 count), then per
// event little-endian uint32 entity, int64 event time ms, int64 amount (Python's
// struct format "<Iqq", 20 bytes).
const (
	seqMagic      = "VBSEQ001"
	seqRecordSize = 20
)

// SeqEvent is one record of the event-sequence file.
type SeqEvent struct {
	Entity uint32
	T      int64
	Amount int64
}

// WriteSeq writes w's stream (event times as produced ahead of a run) to out.
func WriteSeq(out io.Writer, w Workload) error {
	g, err := NewGenerator(w)
	if err != nil {
		return err
	}
	var hdr [16]byte
	copy(hdr[:8], seqMagic)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(w.Events))
	if _, err := out.Write(hdr[:]); err != nil {
		return err
	}
	buf := make([]byte, 0, 4096*seqRecordSize)
	for {
		ev, ok := g.Next()
		if !ok {
			break
		}
		buf = binary.LittleEndian.AppendUint32(buf, ev.Entity)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(w.EventTime(g.Index(), ev.DisorderMs)))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(ev.AmountMin))
		if len(buf) == cap(buf) {
			if _, err := out.Write(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	_, err = out.Write(buf)
	return err
}

// ReadSeq reads an event-sequence file written by WriteSeq.
func ReadSeq(in io.Reader) ([]SeqEvent, error) {
	var hdr [16]byte
	if _, err := io.ReadFull(in, hdr[:]); err != nil {
		return nil, fmt.Errorf("read sequence header: %w", err)
	}
	if string(hdr[:8]) != seqMagic {
		return nil, errors.New("not a velocity-bench sequence file (bad magic)")
	}
	n := binary.LittleEndian.Uint64(hdr[8:])
	if n > 1<<30 {
		return nil, fmt.Errorf("sequence file claims %d events; refusing more than 2^30", n)
	}
	body := make([]byte, int(n)*seqRecordSize)
	if _, err := io.ReadFull(in, body); err != nil {
		return nil, fmt.Errorf("read %d sequence events: %w", n, err)
	}
	evs := make([]SeqEvent, n)
	for i := range evs {
		b := body[i*seqRecordSize:]
		evs[i] = SeqEvent{
			Entity: binary.LittleEndian.Uint32(b),
			T:      int64(binary.LittleEndian.Uint64(b[4:])),
			Amount: int64(binary.LittleEndian.Uint64(b[12:])),
		}
	}
	return evs, nil
}
