package registry

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/sr"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
)

// entry is the resolved state of one schema id: a decoder, or a permanent
// rejection for every value carrying the id.
type entry struct {
	dec codec.Decoder
	rej *codec.Rejection
}

// Decoder decodes Confluent wire-format values. It implements codec.Decoder
// and codec.Preparer and is safe for concurrent use by every partition.
//
// Resolved ids live in a copy-on-write map read without locks, so Decode on
// the hot path costs one atomic load and one map lookup more than a plain
// codec decoder; ids are few and resolved once each.
type Decoder struct {
	cl      *sr.Client
	limits  codec.Limits
	ctx     context.Context // bounds Decode's own waiting (see Decode)
	compile Compile         // a writer schema's decoder; codec.NewDecoder unless NewDecoderWith

	ids atomic.Pointer[map[int]*entry]
	mu  sync.Mutex // serialises resolution so that one id is fetched once

	// minBackoff and maxBackoff bound Decode's waits when it has to resolve
	// an id itself; tests shorten them.
	minBackoff, maxBackoff time.Duration
	// onRetry, if set, is told each time Decode waits for the registry.
	onRetry func(id int, err error)
}

// NewDecoder returns a Decoder that resolves writer schemas through cl and
// applies limits. ctx bounds Decode's own waiting for an unreachable
// registry (see Decode); cancel it at shutdown.
func NewDecoder(ctx context.Context, cl *sr.Client, limits codec.Limits) *Decoder {
	l := limits.WithDefaults()
	return NewDecoderWith(ctx, cl, l, func(schema string) (codec.Decoder, error) { return codec.NewDecoder(schema, l) })
}

// Compile builds the decoder for one writer schema (the Avro schema text the
// registry holds for an id). An error makes every value with that id a decode
// dead letter naming it.
type Compile func(writerSchema string) (codec.Decoder, error)

// NewDecoderWith is NewDecoder with decoders built by compile: a feature
// definition's input mapping (pkg/definition) compiles its paths against each
// writer schema the topic's records name. limits is still applied to the
// wire-format checks this package makes itself.
func NewDecoderWith(ctx context.Context, cl *sr.Client, limits codec.Limits, compile Compile) *Decoder {
	d := &Decoder{cl: cl, limits: limits.WithDefaults(), ctx: ctx, compile: compile, minBackoff: 200 * time.Millisecond, maxBackoff: 10 * time.Second}
	empty := map[int]*entry{}
	d.ids.Store(&empty)
	return d
}

// SchemaID returns the schema id of a wire-format value, or a decode
// rejection for a value that is not in the wire format.
func SchemaID(value []byte) (int, *codec.Rejection) {
	if len(value) < HeaderSize {
		return 0, &codec.Rejection{Reason: codec.ReasonDecode, Detail: "not in the Confluent wire format: " +
			strconv.Itoa(len(value)) + " bytes, shorter than the 5-byte prefix (magic byte 0 + schema id)"}
	}
	if value[0] != 0 {
		return 0, &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
			"not in the Confluent wire format: first byte 0x%02x is not the magic byte 0 (was it written without the schema registry?)", value[0])}
	}
	return int(binary.BigEndian.Uint32(value[1:HeaderSize])), nil
}

// Prepare resolves the writer schema of value if it is not known yet. It
// returns an error only when the registry could not answer; a value Decode
// will reject for good (no prefix, an id that does not exist, a schema that
// cannot be read as a Transaction) prepares without error.
func (d *Decoder) Prepare(ctx context.Context, value []byte) error {
	if len(value) > d.limits.MaxRecordBytes {
		return nil // too_large, rejected before any lookup
	}
	id, rej := SchemaID(value)
	if rej != nil {
		return nil
	}
	if (*d.ids.Load())[id] != nil {
		return nil
	}
	_, err := d.resolve(ctx, id)
	return err
}

// Decode implements codec.Decoder. A value whose id was not prepared is
// resolved here; if the registry cannot be reached, Decode waits and retries
// with backoff (so that a caller that never prepares, such as a replay, still
// dead-letters nothing for an outage) until the Decoder's context ends, and
// only then rejects the value as a decode error that names the outage.
func (d *Decoder) Decode(value []byte, maxSeen int64, hasMaxSeen bool, tx *codec.Transaction) *codec.Rejection {
	if len(value) > d.limits.MaxRecordBytes {
		return &codec.Rejection{Reason: codec.ReasonTooLarge, Detail: "value is " + strconv.Itoa(len(value)) +
			" bytes, over the limit of " + strconv.Itoa(d.limits.MaxRecordBytes)}
	}
	id, rej := SchemaID(value)
	if rej != nil {
		return rej
	}
	e := (*d.ids.Load())[id]
	if e == nil {
		e = d.wait(id)
	}
	if e.rej != nil {
		return e.rej
	}
	return e.dec.Decode(value[HeaderSize:], maxSeen, hasMaxSeen, tx)
}

// wait resolves id, retrying an unreachable registry until d.ctx ends.
func (d *Decoder) wait(id int) *entry {
	backoff := d.minBackoff
	for {
		e, err := d.resolve(d.ctx, id)
		if err == nil {
			return e
		}
		if d.onRetry != nil {
			d.onRetry(id, err)
		}
		select {
		case <-d.ctx.Done():
			return &entry{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
				"schema id %d: stopped while the schema registry was unavailable: %v", id, err)}}
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, d.maxBackoff)
	}
}

// ErrUnavailable marks a registry failure that may pass: retry later.
var ErrUnavailable = errors.New("schema registry unavailable")

// resolve fetches id's schema and caches the outcome unless it is transient.
func (d *Decoder) resolve(ctx context.Context, id int) (*entry, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := (*d.ids.Load())[id]; e != nil {
		return e, nil // another partition resolved it while we waited for the lock
	}
	s, err := d.cl.SchemaByID(ctx, id)
	var e *entry
	switch {
	case err != nil && transient(err):
		return nil, fmt.Errorf("%w: fetch writer schema id %d: %w", ErrUnavailable, id, err)
	case err != nil:
		e = &entry{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
			"schema id %d does not exist in the schema registry: %v", id, err)}}
	case s.Type != sr.TypeAvro:
		e = &entry{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
			"schema id %d is a %s schema, not Avro", id, s.Type)}}
	case len(s.References) > 0:
		e = &entry{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
			"schema id %d has schema references, which this consumer does not resolve", id)}}
	default:
		dec, derr := d.compile(s.Schema)
		if derr != nil {
			e = &entry{rej: &codec.Rejection{Reason: codec.ReasonDecode, Detail: fmt.Sprintf(
				"schema id %d cannot be read by this consumer: %v", id, derr)}}
		} else {
			e = &entry{dec: dec}
		}
	}
	old := *d.ids.Load()
	next := make(map[int]*entry, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[id] = e
	d.ids.Store(&next)
	return e, nil
}
