//go:build integration

package chaos

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/pkg/registry"
	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// The dead-letter headers of the contract (README "What it does"), spelled
// here rather than imported: the checker reads the topics as a user would.
const (
	hdrReason     = "velocity.reason"
	hdrError      = "velocity.error"
	hdrSrcTopic   = "velocity.source.topic"
	hdrSrcPart    = "velocity.source.partition"
	hdrSrcOffset  = "velocity.source.offset"
	hdrDefinition = "velocity.definition"
	hdrGroup      = "velocity.group"
	hdrEmittedAt  = "velocity.emitted_at"
)

var featuresCodec = func() *goavro.Codec {
	c, err := goavro.NewCodec(schemas.VelocityFeatures)
	if err != nil {
		panic(err)
	}
	return c
}()

type srcKey struct {
	part   int32
	offset int64
}

// output is one features record or dead letter, reduced to what must be the
// same in every run over the same input: the kind, the key, the value and,
// for a dead letter, its reason and error. The other headers (processing-time
// facts such as velocity.emitted_at and velocity.host) are left out, as the
// contract allows them to differ.
type output struct {
	dead      bool
	key       []byte
	keyNull   bool
	value     []byte
	valueNull bool
	reason    string
	errText   string
	srcTopic  string
	at        string // topic/partition@offset of the output record, for messages
	// outOffset is the output record's offset in its partition: a
	// partition's features records are in the order the service released
	// them (idle_test.go reads it).
	outOffset int64
	// pid is the producer id that wrote it: a process, from its start (or
	// from a new id its producer had to take) to its end (idle_test.go).
	pid int64
	// schemaID is the schema id of a features value in the wire format (0:
	// none).
	schemaID int
}

func (o output) same(p output) bool {
	return o.dead == p.dead && o.keyNull == p.keyNull && string(o.key) == string(p.key) &&
		o.valueNull == p.valueNull && string(o.value) == string(p.value) &&
		o.reason == p.reason && o.errText == p.errText
}

type tp struct {
	topic string
	part  int32
}

// collector reads a features topic and a dead-letter topic from their start
// for the whole run, in the background, with one isolation level. It keeps
// control records (transaction markers) so that its position in each
// partition is exact: a read_committed reader that has passed the last
// stable offset has seen everything committed below it.
type collector struct {
	cl        *kgo.Client
	adm       *kadm.Client
	committed bool
	features  string
	dlq       string
	out       outputSchema
	// group is the re-keyed group whose outputs this collector reads: its
	// features topic, and the dead letters its second stage decided (their
	// velocity.group header); "" for the input's own outputs, whose dead letters
	// have none.
	group string

	mu    sync.Mutex
	pos   map[tp]int64
	outs  map[srcKey][]output
	bad   []string // records that do not decode or lack their source position
	fetch []string // fetch errors (a broker restart makes some), the first few
}

// outputSchema is how a run's features values are read: ours, or a feature
// definition's generated record, whose outputs must also name the definition
// in their velocity.definition header.
type outputSchema struct {
	codec      *goavro.Codec
	name       string // for messages
	definition string // the velocity.definition header every output carries ("" without --features)
	// wire: a registry run's features values are in the Confluent wire
	// format. The collector keeps the body as the value (what the checks
	// compare) and the schema id apart, which must name the features schema
	// (checkSchemaIDs): live and replay may have registered it under other
	// subjects.
	wire bool
}

var defaultOutput = outputSchema{codec: featuresCodec, name: "schemas/velocity_features.avsc"}

func newCollector(ctx context.Context, addr, features, dlq string, committed bool, out outputSchema, group string) (*collector, error) {
	iso := kgo.ReadUncommitted()
	if committed {
		iso = kgo.ReadCommitted()
	}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(kafkatest.Seeds(addr)...),
		kgo.ConsumeTopics(features, dlq),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(iso),
		kgo.KeepControlRecords(),
		kgo.DialTimeout(5*time.Second),
		kgo.RetryTimeout(time.Minute),
	)
	if err != nil {
		return nil, err
	}
	c := &collector{cl: cl, adm: kadm.NewClient(cl), committed: committed, features: features, dlq: dlq, out: out, group: group,
		pos: map[tp]int64{}, outs: map[srcKey][]output{}}
	go c.loop(ctx)
	return c, nil
}

func (c *collector) close() { c.cl.Close() }

func (c *collector) loop(ctx context.Context) {
	for ctx.Err() == nil {
		fs := c.cl.PollFetches(ctx)
		if fs.IsClientClosed() {
			return
		}
		c.mu.Lock()
		fs.EachError(func(t string, p int32, err error) {
			if len(c.fetch) < 5 && ctx.Err() == nil {
				c.fetch = append(c.fetch, fmt.Sprintf("%s/%d: %v", t, p, err))
			}
		})
		fs.EachRecord(func(r *kgo.Record) {
			c.pos[tp{r.Topic, r.Partition}] = r.Offset + 1
			if r.Attrs.IsControl() {
				return
			}
			if r.Topic == c.dlq && headerOf(r, hdrGroup) != c.group {
				return // another group's (or the input's) dead letter
			}
			k, o, err := c.out.classify(r, r.Topic == c.dlq)
			if err != nil {
				c.bad = append(c.bad, err.Error())
				return
			}
			c.outs[k] = append(c.outs[k], o)
		})
		c.mu.Unlock()
	}
}

// emittedAt says when a features record was produced (its velocity.emitted_at
// header, a UTC time of day); a dead letter has no such header.
func emittedAt(r *kgo.Record) string {
	for _, x := range r.Headers {
		if x.Key == hdrEmittedAt {
			if ms, err := strconv.ParseInt(string(x.Value), 10, 64); err == nil {
				return "emitted " + time.UnixMilli(ms).UTC().Format("15:04:05.000")
			}
		}
	}
	return "no emission time"
}

// classify reads the source position an output names: the lineage fields of
// a features value (decoded with the published schema), the
// velocity.source.* headers of a dead letter.
func (os outputSchema) classify(r *kgo.Record, dead bool) (srcKey, output, error) {
	// The producer id tells the processes (and their restarts) apart, the
	// emission time finds the moment in their logs: for the reader of a
	// failure.
	at := fmt.Sprintf("%s/%d@%d (producer %d, %s)", r.Topic, r.Partition, r.Offset, r.ProducerID, emittedAt(r))
	o := output{dead: dead, key: r.Key, keyNull: r.Key == nil, value: r.Value, valueNull: r.Value == nil, at: at, outOffset: r.Offset, pid: r.ProducerID}
	if os.definition != "" {
		var def string
		for _, x := range r.Headers {
			if x.Key == hdrDefinition {
				def = string(x.Value)
			}
		}
		if def != os.definition {
			return srcKey{}, o, fmt.Errorf("%s has velocity.definition %q, want %q", at, def, os.definition)
		}
	}
	if !dead && os.wire {
		id, rej := registry.SchemaID(r.Value)
		if rej != nil {
			return srcKey{}, o, fmt.Errorf("features record %s: %s", at, rej.Detail)
		}
		o.schemaID, o.value = id, r.Value[registry.HeaderSize:]
	}
	if !dead {
		native, rest, err := os.codec.NativeFromBinary(o.value)
		if err != nil || len(rest) != 0 {
			return srcKey{}, o, fmt.Errorf("features record %s does not decode with %s: %v (%d bytes left)", at, os.name, err, len(rest))
		}
		m := native.(map[string]any)
		p, _ := m["source_partition"].(int32)
		off, _ := m["source_offset"].(int64)
		o.srcTopic, _ = m["source_topic"].(string)
		return srcKey{p, off}, o, nil
	}
	h := map[string]string{}
	for _, x := range r.Headers {
		h[x.Key] = string(x.Value)
	}
	p, err1 := strconv.ParseInt(h[hdrSrcPart], 10, 32)
	off, err2 := strconv.ParseInt(h[hdrSrcOffset], 10, 64)
	if err1 != nil || err2 != nil {
		return srcKey{}, o, fmt.Errorf("dead letter %s lacks its source headers: %q", at, h)
	}
	o.reason, o.errText, o.srcTopic = h[hdrReason], h[hdrError], h[hdrSrcTopic]
	return srcKey{int32(p), off}, o, nil
}

func headerOf(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// catchUp lists the topics' ends (the last stable offsets for a
// read_committed collector, the high watermarks otherwise) and waits until
// the collector has read up to them, or ctx ends. It returns a copy of what
// the collector holds then.
func (c *collector) catchUp(ctx context.Context) (map[srcKey][]output, error) {
	var ends kadm.ListedOffsets
	var err error
	for {
		if c.committed {
			ends, err = c.adm.ListCommittedOffsets(ctx, c.features, c.dlq)
		} else {
			ends, err = c.adm.ListEndOffsets(ctx, c.features, c.dlq)
		}
		if err == nil {
			err = ends.Error()
		}
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		return nil, fmt.Errorf("list the ends of %s and %s: %w", c.features, c.dlq, err)
	}
	for {
		behind := ""
		c.mu.Lock()
		ends.Each(func(o kadm.ListedOffset) {
			if got := c.pos[tp{o.Topic, o.Partition}]; got < o.Offset && behind == "" {
				behind = fmt.Sprintf("%s/%d at %d of %d", o.Topic, o.Partition, got, o.Offset)
			}
		})
		if behind == "" {
			snap := make(map[srcKey][]output, len(c.outs))
			for k, v := range c.outs {
				snap[k] = append([]output(nil), v...)
			}
			c.mu.Unlock()
			return snap, nil
		}
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("reader of %s and %s still behind (%s): %w", c.features, c.dlq, behind, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *collector) problems() (bad, fetch []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.bad...), append([]string(nil), c.fetch...)
}

// readInput reads the input topic up to ends and returns, per offset, what
// the generator said the record is (its chaos.gen header), for messages.
func readInput(ctx context.Context, addr, topic string, ends map[int32]int64) (map[srcKey]string, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkatest.Seeds(addr)...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DialTimeout(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	left := maps.Clone(ends)
	for p, e := range left {
		if e == 0 {
			delete(left, p)
		}
	}
	out := map[srcKey]string{}
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return out, fmt.Errorf("read %s: %w", topic, ctx.Err())
		}
		fs.EachRecord(func(r *kgo.Record) {
			gen := ""
			for _, h := range r.Headers {
				if h.Key == genHeader {
					gen = string(h.Value)
				}
			}
			out[srcKey{r.Partition, r.Offset}] = gen
			if e, ok := left[r.Partition]; ok && r.Offset+1 >= e {
				delete(left, r.Partition)
			}
		})
	}
	return out, nil
}
