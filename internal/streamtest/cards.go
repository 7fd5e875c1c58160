package streamtest

import (
	"fmt"
	"io"
	"math"
	"math/big"
	"math/rand/v2"
	"time"

	"github.com/linkedin/goavro/v2"
)

// Card streams: records of a schema we did not design (examples/features/
// card_transaction.avsc: ids nested in records, a decimal amount, the time in
// microseconds, an enum status, a nullable merchant), for the tests of feature
// definitions. They are adversarial on purpose: skewed cards (one hot card with
// more distinct merchants than a definition counts exactly), events on bucket
// edges, sub-millisecond times, out-of-order events inside and outside the
// allowed lateness, duplicates, a null merchant, amounts with cents that a
// coarser exponent refuses, empty and over-long ids, times before 2000.

// CardStreamConfig shapes CardStream.
type CardStreamConfig struct {
	Seed        uint64
	N           int           // records
	Cards       int           // distinct cards besides the hot one
	HotShare    float64       // share of records on card "hot"
	Merchants   int           // merchant ids the ordinary cards draw from
	HotDistinct int           // distinct merchants of the hot card
	Lateness    time.Duration // the allowed lateness the stream is shaped around
}

// CardStream returns n records (goavro native form, for schema) in
// production order.
func CardStream(cfg CardStreamConfig) []map[string]any {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))
	base := Base * 1000 // micros
	t := base
	var out []map[string]any
	var ids []string
	for i := range cfg.N {
		// Time moves forward by 0..3 s, now and then jumps to a bucket edge.
		t += rng.Int64N(3_000_000)
		ts := t
		switch r := rng.IntN(100); {
		case r < 3:
			ts = (t/60_000_000)*60_000_000 - 1 // the last microsecond of a minute
		case r < 6:
			ts = (t / 60_000_000) * 60_000_000
		case r < 12:
			ts = t - rng.Int64N(int64(cfg.Lateness/time.Microsecond)) // out of order, inside the lateness
		case r < 14:
			ts = t - int64(cfg.Lateness/time.Microsecond) - 1_000_000 - rng.Int64N(60_000_000) // late
		}
		card := fmt.Sprintf("card-%03d", int(float64(cfg.Cards)*rng.Float64()*rng.Float64()))
		merchant := fmt.Sprintf("m-%03d", rng.IntN(cfg.Merchants))
		if rng.Float64() < cfg.HotShare {
			card = "hot"
			merchant = fmt.Sprintf("hm-%04d", rng.IntN(cfg.HotDistinct))
		}
		id := fmt.Sprintf("tx-%d-%d", cfg.Seed, i)
		switch r := rng.IntN(200); {
		case r < 6 && len(ids) > 0:
			id = ids[rng.IntN(len(ids))] // a duplicate
		case r == 6:
			id = ""
		case r == 7:
			id = string(make([]byte, 129))
		}
		ids = append(ids, id)
		cents := rng.Int64N(50_000)
		if rng.IntN(8) != 0 {
			cents = cents / 10 * 10 // a whole number of tens of cents; the rest have a hundredth
		}
		if rng.IntN(30) == 0 {
			cents = 60_000 + rng.Int64N(40_000) // large
		}
		status := []string{"APPROVED", "APPROVED", "APPROVED", "DECLINED", "REVERSED"}[rng.IntN(5)]
		rec := map[string]any{
			"txn_id":       id,
			"card":         map[string]any{"id": card, "bin": nil},
			"merchant":     goavro.Union("com.example.payments.Merchant", map[string]any{"id": merchant, "mcc": fmt.Sprintf("%04d", 5000+rng.IntN(40)), "country": nil}),
			"amount":       big.NewRat(cents, 100),
			"currency":     "EUR",
			"ts":           time.UnixMicro(ts).UTC(),
			"status":       status,
			"card_present": rng.IntN(3) != 0,
			"channel":      nil,
			"tags":         map[string]any{},
		}
		switch r := rng.IntN(100); {
		case r < 3:
			rec["merchant"] = nil
		case r == 3:
			rec["ts"] = time.UnixMicro(900_000_000_000_000).UTC() // 1998: before the minimum event time
		case r == 4:
			rec["card"] = map[string]any{"id": "", "bin": nil}
		}
		out = append(out, rec)
	}
	return out
}

// WriteCardOCF writes records as an Avro object container file with schema.
func WriteCardOCF(w io.Writer, schema string, records []map[string]any) error {
	ocf, err := goavro.NewOCFWriter(goavro.OCFConfig{W: w, Schema: schema})
	if err != nil {
		return err
	}
	for i := 0; i < len(records); i += 500 {
		vals := make([]any, 0, 500)
		for _, r := range records[i:min(i+500, len(records))] {
			vals = append(vals, r)
		}
		if err := ocf.Append(vals); err != nil {
			return err
		}
	}
	return nil
}

// EncodeCards returns records as plain Avro binary values of schema, for a topic.
func EncodeCards(schema string, records []map[string]any) ([][]byte, error) {
	c, err := goavro.NewCodec(schema)
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(records))
	for i, r := range records {
		if out[i], err = c.BinaryFromNative(nil, r); err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
	}
	return out, nil
}

// DistinctEstimateOK holds one distinct-count estimate to four times the relative
// standard error docs/feature-outputs.md publishes, sqrt(2/max_exact), plus two
// values of slack for small counts.
func DistinctEstimateOK(est, exact int64, maxExact int) bool {
	d := math.Abs(float64(est - exact))
	return d <= 4*math.Sqrt(2/float64(maxExact))*float64(exact)+2
}
