package streamtest

import (
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// Payment streams: records of testdata/payment_event.avsc (a card payment with
// the device and IP it came from) for the tests of definitions with re-keyed
// groups (docs/repartition.md, testdata/payment_groups.yaml). The input topic is
// keyed by card; the device and IP keys are correlated with the card and skewed
// so that a re-keyed group's partition receives every input partition's records:
//
//   - many cards, drawn with a skew (the lowest-numbered cards are the busiest);
//   - each card has a home device: "dev-hot" for about HotDeviceShare of the
//     cards, one of a few shared devices ("dev-shared-N") for about 15 % of
//     them, its own otherwise; now and then a card uses a second device of its
//     own. So dev-hot holds more distinct cards than a distinct count keeps
//     exactly (max_exact 64);
//   - about HotIPShare of the records come from "ip-hot", the rest from the
//     card's home network (a few hundred addresses shared by several cards);
//   - device_id and ip are null on some records and "" on others (no key: no
//     row for that group, not an error), and over 256 bytes on a few otherwise
//     valid records (invalid:device_id, invalid:ip);
//   - the input partition is Kafka's default partitioner's for the card id
//     (repartition.PartitionFor); partition p's clock runs p × PartitionLag
//     behind, so production order is not event-time order across partitions;
//   - inside a partition: out-of-order events within the lateness, late events
//     beyond it, events on minute and 5-second bucket edges and at the same
//     millisecond, device and IP as another partition's previous event (so that
//     only the partition orders the two within a key), resends of a recent
//     record (duplicates), an event id reused with other content, and the same
//     event id on two partitions (two transactions, both counted);
//   - amounts in mills (decimal scale 3) of which some have a nonzero
//     thousandth (invalid:amount with amount_exponent 2), empty and over-long
//     event ids, empty card ids, times before 2000.
//
// Use: s := PaymentStream(cfg); then WritePaymentOCFs (one container file per
// partition, for replay and the reference: RunGroupReference) or
// PaymentRecords (kgo records with explicit partitions and card keys, for a
// topic; produce them with kgo.RecordPartitioner(kgo.ManualPartitioner()) or a
// keyed default partitioner, which picks the same partitions).

// PaymentSchemaFile and PaymentGroupsFile are the schema and definition the
// payment streams are written for, relative to this package's directory.
const (
	PaymentSchemaFile = "testdata/payment_event.avsc"
	PaymentGroupsFile = "testdata/payment_groups.yaml"
)

// PaymentStreamConfig shapes PaymentStream. Zero fields take the defaults
// noted.
type PaymentStreamConfig struct {
	Seed           uint64
	N              int           // records over all partitions (default 6000)
	Partitions     int           // input partitions (default 3)
	Cards          int           // cards (default 400)
	SharedDevices  int           // devices besides dev-hot shared by several cards (default 4)
	HotDeviceShare float64       // share of cards whose home device is dev-hot (default 0.3)
	HotIPShare     float64       // share of records from ip-hot (default 0.2)
	Lateness       time.Duration // the allowed lateness the stream is shaped around (default 5 s)
	PartitionLag   time.Duration // partition p's clock runs p × this behind (default 2 s)
}

func (c *PaymentStreamConfig) defaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.N, 6000)
	def(&c.Partitions, 3)
	def(&c.Cards, 400)
	def(&c.SharedDevices, 4)
	if c.HotDeviceShare == 0 {
		c.HotDeviceShare = 0.3
	}
	if c.HotIPShare == 0 {
		c.HotIPShare = 0.2
	}
	if c.Lateness == 0 {
		c.Lateness = 5 * time.Second
	}
	if c.PartitionLag == 0 {
		c.PartitionLag = 2 * time.Second
	}
}

// Payments is a generated payment stream: per input partition, its records in
// offset order (goavro native form for PaymentSchemaFile) and each record's
// Kafka key: its card id, or for a record whose card.id was emptied (an
// invalid:card.id) the card it was generated for. Keys[p][i] always belongs
// to partition p (repartition.PartitionFor).
type Payments struct {
	Parts [][]map[string]any
	Keys  [][]string
}

// Len is the number of records over all partitions.
func (s Payments) Len() int {
	n := 0
	for _, p := range s.Parts {
		n += len(p)
	}
	return n
}

// HotDevice and HotIP are the keys PaymentStream skews towards.
const (
	HotDevice = "dev-hot"
	HotIP     = "203.0.113.7"
)

// PaymentStream generates a payment stream (see the comment above
// PaymentSchemaFile for what it contains). The same config gives the same
// stream.
func PaymentStream(cfg PaymentStreamConfig) Payments {
	cfg.defaults()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0xfeed))
	type card struct {
		id, device, ip string
		part           int
	}
	cards := make([]card, cfg.Cards)
	for i := range cards {
		c := card{id: fmt.Sprintf("c-%04d", i)}
		switch u := rng.Float64(); {
		case u < cfg.HotDeviceShare:
			c.device = HotDevice
		case u < cfg.HotDeviceShare+0.15:
			c.device = fmt.Sprintf("dev-shared-%d", rng.IntN(cfg.SharedDevices))
		default:
			c.device = "dev-" + c.id
		}
		// A home network shared by a few cards.
		n := rng.IntN(max(cfg.Cards/3, 1))
		c.ip = fmt.Sprintf("198.51.%d.%d", n/250, n%250)
		c.part = int(repartition.PartitionFor(c.id, int32(cfg.Partitions)))
		cards[i] = c
	}
	s := Payments{Parts: make([][]map[string]any, cfg.Partitions), Keys: make([][]string, cfg.Partitions)}
	lateness := cfg.Lateness.Microseconds()
	t := Base * 1000 // micros
	var lastTS int64
	var lastDevice, lastIP string
	lastPart := -1
	for i := range cfg.N {
		t += rng.Int64N(1_500_000)
		c := cards[int(float64(cfg.Cards)*rng.Float64()*rng.Float64())]
		p := c.part
		tp := t - int64(p)*cfg.PartitionLag.Microseconds() // this partition's clock
		ts, tie := tp, false
		switch r := rng.IntN(100); {
		case r < 3:
			ts = (tp/60_000_000)*60_000_000 - 1 // the last microsecond of a minute
		case r < 6:
			ts = (tp / 5_000_000) * 5_000_000 // a 5 s bucket edge
		case r < 8 && lastPart >= 0 && lastPart != p && lastTS > tp-lateness/2 && lastTS < tp+lateness:
			ts, tie = lastTS, true // the same instant as another partition's previous event
		case r < 14:
			ts = tp - rng.Int64N(lateness) // out of order, inside the lateness
		case r < 16:
			ts = tp - lateness - 1_000_000 - rng.Int64N(60_000_000) // late at its partition
		}
		device, ip := c.device, c.ip
		if rng.IntN(20) == 0 {
			device = "dev-" + c.id + "-b"
		}
		if rng.Float64() < cfg.HotIPShare {
			ip = HotIP
		}
		if tie {
			// From the same device and address as that event (one device
			// trying several cards at once), so that the tie is within a key
			// of each re-keyed group and only the partition orders the two.
			device, ip = lastDevice, lastIP
		}
		lastTS, lastPart, lastDevice, lastIP = ts, p, device, ip
		mills := rng.Int64N(500_000) / 10 * 10
		switch {
		case rng.IntN(20) == 0:
			mills += 1 + rng.Int64N(9) // a nonzero thousandth: more digits than amount_exponent 2 allows
		case rng.IntN(30) == 0:
			mills = 600_000 + rng.Int64N(400_000)*10 // large
		}
		rec := map[string]any{
			"txn_id":      fmt.Sprintf("tx-%d-%d", cfg.Seed, i),
			"card":        map[string]any{"id": c.id},
			"device_id":   goavro.Union("string", device),
			"ip":          goavro.Union("string", ip),
			"merchant_id": fmt.Sprintf("m-%02d", rng.IntN(30)),
			"amount":      big.NewRat(mills, 1000),
			"currency":    "EUR",
			"ts":          time.UnixMicro(ts).UTC(),
			"status":      []string{"APPROVED", "APPROVED", "APPROVED", "DECLINED", "REVERSED"}[rng.IntN(5)],
		}
		switch r := rng.IntN(100); {
		case r < 5:
			rec["device_id"] = nil
		case r < 7:
			rec["device_id"] = goavro.Union("string", "")
		}
		switch r := rng.IntN(100); {
		case r < 5:
			rec["ip"] = nil
		case r < 7:
			rec["ip"] = goavro.Union("string", "")
		}
		part, key := s.Parts[p], c.id
		switch r := rng.IntN(1000); {
		case r < 30 && len(part) > 0:
			// A resend of a recent record of this partition: a duplicate,
			// unless the original was itself refused.
			j := len(part) - 1 - rng.IntN(min(len(part), 50))
			rec, key = part[j], s.Keys[p][j]
		case r < 40 && len(part) > 0:
			rec["txn_id"] = part[rng.IntN(len(part))]["txn_id"] // the id again, other content
		case r < 55:
			// The id of a recent record of another partition: another
			// transaction there, so both are counted.
			if cfg.Partitions > 1 {
				o := (p + 1 + rng.IntN(cfg.Partitions-1)) % cfg.Partitions
				if q := s.Parts[o]; len(q) > 0 {
					rec["txn_id"] = q[len(q)-1-rng.IntN(min(len(q), 50))]["txn_id"]
				}
			}
		case r < 60:
			rec["txn_id"] = ""
		case r < 63:
			rec["txn_id"] = strings.Repeat("x", 129)
		case r < 68:
			rec["card"] = map[string]any{"id": ""}
		case r < 71:
			rec["ts"] = time.UnixMicro(900_000_000_000_000).UTC() // 1998: before the minimum event time
		case r < 76:
			// Over-long keys only on records with no other fault, so that the
			// reason does not depend on the order the rules are checked in.
			if mills%10 == 0 && ts >= lastPartitionMax(part)-lateness {
				if r < 74 {
					rec["device_id"] = goavro.Union("string", "dev-"+strings.Repeat("d", 300))
				} else {
					rec["ip"] = goavro.Union("string", strings.Repeat("9", 257))
				}
			}
		}
		s.Parts[p] = append(part, rec)
		s.Keys[p] = append(s.Keys[p], key)
	}
	return s
}

// lastPartitionMax is the newest event time (micros) among recs, or the
// minimum int64 for none: a record at or after it minus the lateness is not
// late whatever else the partition holds.
func lastPartitionMax(recs []map[string]any) int64 {
	m := int64(-1 << 63)
	for _, r := range recs {
		if ts := r["ts"].(time.Time).UnixMicro(); ts > m {
			m = ts
		}
	}
	return m
}

// WritePaymentOCFs writes each partition of s as dir/p<N>.avro, an Avro object
// container file of schema, and returns the paths in partition order (the
// inputs RunGroupReference takes).
func WritePaymentOCFs(dir, schema string, s Payments) ([]string, error) {
	var paths []string
	for p, recs := range s.Parts {
		path := filepath.Join(dir, fmt.Sprintf("p%d.avro", p))
		f, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		if err := WriteCardOCF(f, schema, recs); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Close(); err != nil {
			return nil, err
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// PaymentRecords returns s as records for topic: plain Avro binary values of
// schema, keyed by card id, with explicit partitions, in offset order per
// partition (partition 0's records first, then 1's, ...).
func PaymentRecords(topic, schema string, s Payments) ([]*kgo.Record, error) {
	var out []*kgo.Record
	for p, recs := range s.Parts {
		vals, err := EncodeCards(schema, recs)
		if err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, err)
		}
		for i, v := range vals {
			out = append(out, &kgo.Record{Topic: topic, Partition: int32(p), Key: []byte(s.Keys[p][i]), Value: v})
		}
	}
	return out, nil
}
