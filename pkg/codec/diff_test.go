package codec

import (
	"bytes"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/twmb/avro"

	"github.com/velocity-consumer/velocity-consumer/schemas"
)

// The hand-written codec is only trusted because it agrees with goavro (and,
// for encoding, twmb/avro) on every record below. A fixed seed keeps a failure
// reproducible; the fuzz targets in fuzz_test.go explore beyond it.

var edgeLongs = []int64{0, 1, -1, 63, 64, -64, -65, 1e15, 1e15 + 1, defaultMinEventTime, defaultMinEventTime - 1,
	t0, math.MaxInt32, math.MinInt32, math.MaxInt64, math.MinInt64}

func randLong(r *rand.Rand) int64 {
	switch r.IntN(3) {
	case 0:
		return edgeLongs[r.IntN(len(edgeLongs))]
	case 1:
		return r.Int64N(1e15)
	default:
		return int64(r.Uint64())
	}
}

func randString(r *rand.Rand, max int) string {
	alphabet := []string{"a", "Z", "0", "-", "é", "€", "\x00", "\xff", "\xc3", "E", "U", "R"}
	var b []byte
	for n := r.IntN(max + 1); len(b) < n; {
		b = append(b, alphabet[r.IntN(len(alphabet))]...)
	}
	return string(b)
}

func randTx(r *rand.Rand) Transaction {
	tx := goodTx()
	// Most records break at most one rule, so that every validation branch and
	// the accept path are all exercised.
	switch r.IntN(8) {
	case 0:
		tx.EventID = randString(r, 140)
	case 1:
		tx.EntityID = randString(r, 270)
	case 2:
		tx.AmountMinor = randLong(r)
	case 3:
		tx.Currency = []string{"", "EUR", "eur", "EU", "EURO", "€", randString(r, 4)}[r.IntN(7)]
	case 4:
		tx.EventTime = randLong(r)
	case 5:
		tx = Transaction{EventID: randString(r, 140), EntityID: randString(r, 270), AmountMinor: randLong(r), Currency: randString(r, 4), EventTime: randLong(r)}
	}
	return tx
}

// mutate damages a valid record the way transport and producer bugs do.
func mutate(r *rand.Rand, b []byte) []byte {
	b = bytes.Clone(b)
	switch r.IntN(5) {
	case 0: // truncate
		return b[:r.IntN(len(b)+1)]
	case 1: // flip a byte
		if len(b) > 0 {
			b[r.IntN(len(b))] ^= byte(1 + r.IntN(255))
		}
		return b
	case 2: // trailing bytes
		return append(b, byte(r.IntN(256)))
	case 3: // insert a random byte
		i := r.IntN(len(b) + 1)
		return append(b[:i], append([]byte{byte(r.IntN(256))}, b[i:]...)...)
	default: // overwrite a stretch with a varint-looking run
		for i := r.IntN(len(b) + 1); i < len(b) && r.IntN(4) != 0; i++ {
			b[i] = 0x80 | byte(r.IntN(128))
		}
		return b
	}
}

func TestDifferentialTransactions(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	fast, ref := refDecoder(t)
	tw := newTwmbDecoder(t, DefaultLimits())
	seen := map[Reason]int{}
	for i := range 20000 {
		tx := randTx(r)
		ours := EncodeTransaction(&tx)
		theirs, err := ourTransaction.BinaryFromNative(nil, map[string]any{"event_id": tx.EventID,
			"entity_id": tx.EntityID, "amount_minor": tx.AmountMinor, "currency": tx.Currency, "event_time": tx.EventTime})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ours, theirs) {
			t.Fatalf("#%d EncodeTransaction(%+v)\n got %x\nwant %x (goavro)", i, tx, ours, theirs)
		}
		maxSeen, hasMaxSeen := randLong(r), r.IntN(2) == 0
		for _, value := range [][]byte{ours, mutate(r, ours)} {
			rf := checkDecode(t, fast, ref, value, maxSeen, hasMaxSeen)
			if rf == nil {
				seen["accepted"]++
			} else {
				seen[rf.Reason]++
			}
			// twmb/avro is a third opinion on what decodes at all.
			var got Transaction
			rt := tw.Decode(value, maxSeen, hasMaxSeen, &got)
			if (rf == nil) != (rt == nil) && !goavroIsLaxHere(rf) {
				t.Fatalf("#%d fast says %v, twmb/avro says %v for %x", i, rf, rt, value)
			}
		}
	}
	// A generator that never reaches a branch would make this test vacuous.
	for _, want := range []Reason{"accepted", ReasonDecode, ReasonInvalidEventID, ReasonInvalidEntityID,
		ReasonInvalidAmountMinor, ReasonInvalidCurrency, ReasonInvalidEventTime} {
		if seen[want] < 100 {
			t.Errorf("only %d records ended as %q: %v", seen[want], want, seen)
		}
	}
	t.Logf("outcomes: %v", seen)
}

func randFeatures(r *rand.Rand) Features {
	f := Features{EventID: randString(r, 40), EntityID: randString(r, 40), EventTime: randLong(r),
		MsSincePrevious: randLong(r), HasPrevious: r.IntN(2) == 0, Late: r.IntN(2) == 0,
		SourceTopic: randString(r, 20), SourcePartition: int32(r.Uint32()), SourceOffset: randLong(r)}
	for range r.IntN(6) {
		f.Windows = append(f.Windows, WindowAgg{randString(r, 4), randLong(r), randLong(r), randLong(r), randLong(r), randLong(r), randLong(r)})
	}
	if !f.HasPrevious {
		f.MsSincePrevious = 0 // null carries no value back
	}
	return f
}

func TestDifferentialFeatures(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	tw := avro.MustParse(schemas.VelocityFeatures)
	for i := range 20000 {
		f := randFeatures(r)
		ours := AppendFeatures(nil, &f)
		theirs, err := goavroFeatures(nil, &f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ours, theirs) {
			t.Fatalf("#%d AppendFeatures(%+v)\n got %x\nwant %x (goavro)", i, f, ours, theirs)
		}
		tf := toTwmbFeatures(&f)
		if third, err := tw.AppendEncode(nil, &tf); err != nil || !bytes.Equal(ours, third) {
			t.Fatalf("#%d AppendFeatures(%+v)\n got %x\nwant %x (twmb/avro, err %v)", i, f, ours, third, err)
		}
		back, err := DecodeFeatures(ours)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := goavroDecodeFeatures(ours)
		if err != nil {
			t.Fatal(err)
		}
		if f.Windows == nil {
			back.Windows, ref.Windows = nil, nil // empty and nil slices are the same record
		}
		if !reflect.DeepEqual(back, f) || !reflect.DeepEqual(ref, f) {
			t.Fatalf("#%d round trip of %+v\n ours   %+v\n goavro %+v", i, f, back, ref)
		}
		// Same input, same bytes: determinism is what makes replay byte-identical.
		if again := AppendFeatures(nil, &f); !bytes.Equal(again, ours) {
			t.Fatalf("#%d encoding is not deterministic", i)
		}
	}
}
