package streamtest

import (
	"fmt"
	"maps"
	"math/big"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"

	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

const referenceScript = "../../integration/reference/features_reference.py"

// payment builds one record of testdata/payment_event.avsc. device is nil for
// a null device_id; at is milliseconds after Base; amount is a decimal text.
func payment(id, card string, device any, at int64, amount, status string) map[string]any {
	r, ok := new(big.Rat).SetString(amount)
	if !ok {
		panic(amount)
	}
	var dev any
	if device != nil {
		dev = goavro.Union("string", device)
	}
	return map[string]any{
		"txn_id": id, "card": map[string]any{"id": card}, "device_id": dev, "ip": nil,
		"merchant_id": "m-1", "amount": r, "currency": "EUR",
		"ts": time.UnixMilli(Base + at).UTC(), "status": status,
	}
}

func writePartitions(t *testing.T, parts [][]map[string]any) []string {
	t.Helper()
	schema, err := os.ReadFile(PaymentSchemaFile)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := WritePaymentOCFs(t.TempDir(), string(schema), Payments{Parts: parts})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

// TestGroupReferenceByHand runs the reference over two partitions feeding one
// device group and holds every line to values worked out by hand from
// docs/repartition.md and docs/feature-outputs.md (testdata/device_selfcheck.yaml:
// in place, n = count over 1m:10s per card; group device, windows 1m:10s and
// 10s:1s, max_exact 2). Lateness is 2 s; times are ms after Base, which is on
// a minute.
func TestGroupReferenceByHand(t *testing.T) {
	RequireReference(t)
	const D = "dev-D"
	p0 := []map[string]any{
		payment("a1", "A", D, 1000, "1.00", "APPROVED"),
		payment("a2", "A", D, 5000, "2.00", "DECLINED"),
		payment("a3", "A", nil, 6000, "3.00", "APPROVED"), // null device: no device row
		payment("a2", "A", D, 5000, "2.00", "DECLINED"),   // duplicate at P0
		payment("a4", "C", D, 12000, "0.50", "APPROVED"),  // P0's newest is now 12000
		payment("a5", "A", D, 9000, "5.00", "APPROVED"),   // 9000 < 12000 - 2000: late at P0
		payment("a6", "C", "", 11000, "6.00", "APPROVED"), // out of order within the lateness; empty device
		payment("a7", "A", D, 70000, "4.00", "APPROVED"),
	}
	p1 := []map[string]any{
		payment("b1", "B", D, 3000, "10.00", "DECLINED"),
		payment("b2", "B", D, 2000, "0.25", "APPROVED"),                                // out of order within the lateness
		payment("b3", "B", D, 5000, "1.50", "REVERSED"),                                // ties P0's a2 at 5000: P0 first
		payment("a4", "B", D, 12000, "0.75", "APPROVED"),                               // P0's id on P1: another transaction; ties a4 at 12000
		payment("b5", "B", D, 65000, "0.10", "APPROVED"),                               //
		payment("b6", "B", D, 66000, "1.234", "APPROVED"),                              // a thousandth: invalid:amount
		payment("b7", "B", "dev-"+strings.Repeat("x", 253), 67000, "1.00", "APPROVED"), // a 257-byte key: invalid:device_id
	}
	ref := RunGroupReference(t, referenceScript, "testdata/device_selfcheck.yaml", writePartitions(t, [][]map[string]any{p0, p1}), 2*time.Second, "payments")

	// Dead letters, decided at each partition alone.
	wantDead := map[Source]string{{0, 3}: "duplicate", {0, 5}: "late", {1, 5}: "invalid:amount", {1, 6}: "invalid:device_id"}
	for s, l := range ref.Inputs {
		if l.Dead != wantDead[s] {
			t.Errorf("%v: dead %q, want %q", s, l.Dead, wantDead[s])
		}
	}
	if len(ref.Inputs) != len(p0)+len(p1) {
		t.Errorf("%d input lines, want %d", len(ref.Inputs), len(p0)+len(p1))
	}

	// In place, per partition, per card, in (time, offset) order: n_1m and
	// ms_since_previous.
	type inPlace struct {
		n   int64
		msp any
	}
	wantCard := map[Source]inPlace{
		{0, 0}: {1, nil}, {0, 1}: {2, int64(4000)}, {0, 2}: {3, int64(1000)}, {0, 7}: {1, int64(64000)}, // card A
		{0, 6}: {1, nil}, {0, 4}: {2, int64(1000)}, // card C: 11000 then 12000
		{1, 1}: {1, nil}, {1, 0}: {2, int64(1000)}, {1, 2}: {3, int64(2000)}, {1, 3}: {4, int64(7000)}, {1, 4}: {2, int64(53000)}, // card B
	}
	if got := len(ref.Rows[ref.InPlace]); ref.InPlace != "card" || got != len(wantCard) {
		t.Errorf("in-place group %q has %d rows, want card with %d", ref.InPlace, got, len(wantCard))
	}
	for s, w := range wantCard {
		f := ref.Rows["card"][s].Features
		if f["n_1m"] != w.n || f["ms_since_previous"] != w.msp || f["source_partition"] != int64(s.Partition) || f["source_offset"] != s.Offset {
			t.Errorf("card row %v: %v, want n_1m %d ms_since_previous %v", s, f, w.n, w.msp)
		}
	}

	// Group device: the nine accepted records with a device, applied in
	// (time, partition, offset) order across both partitions:
	//   1000 P0/0 A 100 | 2000 P1/1 B 25 | 3000 P1/0 B 1000 DECLINED |
	//   5000 P0/1 A 200 DECLINED | 5000 P1/2 B 150 REVERSED | 12000 P0/4 C 50 |
	//   12000 P1/3 B 75 | 65000 P1/4 B 10 | 70000 P0/7 A 400
	// 1m:10s reads the buckets [k-5, k] of 10 s, 10s:1s [k-9, k] of 1 s.
	type devRow struct {
		src                              Source
		id, card                         string
		at                               int64
		n1m, n10s, spend, low, dec, dist int64
		msp                              any
		over                             bool
	}
	wantDev := []devRow{
		{Source{0, 0}, "a1", "A", 1000, 1, 1, 100, 100, 0, 1, nil, false},
		{Source{1, 1}, "b2", "B", 2000, 2, 2, 125, 25, 0, 2, int64(1000), false},
		{Source{1, 0}, "b1", "B", 3000, 3, 3, 1125, 25, 1, 2, int64(1000), false},
		{Source{0, 1}, "a2", "A", 5000, 4, 4, 1325, 25, 2, 2, int64(2000), false},
		{Source{1, 2}, "b3", "B", 5000, 5, 5, 1475, 25, 2, 2, int64(0), false},
		// 10s at 12000: buckets 3..12 s hold 3000, 5000, 5000 and itself; A, B, C
		// are three cards: more than max_exact 2, from here on for this key.
		{Source{0, 4}, "a4", "C", 12000, 6, 4, 1525, 25, 2, 3, int64(7000), true},
		{Source{1, 3}, "a4", "B", 12000, 7, 5, 1600, 25, 2, 3, int64(0), true},
		// 1m at 65000: buckets 10..69 s hold the two at 12000 and itself.
		{Source{1, 4}, "b5", "B", 65000, 3, 1, 135, 10, 0, 2, int64(53000), true},
		// 1m at 70000: buckets 20..79 s; 10s: 61..70 s.
		{Source{0, 7}, "a7", "A", 70000, 2, 2, 410, 10, 0, 2, int64(5000), true},
	}
	dev := ref.Rows["device"]
	if len(dev) != len(wantDev) {
		t.Errorf("device has %d rows, want %d", len(dev), len(wantDev))
	}
	for _, w := range wantDev {
		want := map[string]any{
			"event_id": w.id, "entity_id": D, "event_time": Base + w.at,
			"n_1m": w.n1m, "n_10s": w.n10s, "spend_1m": w.spend, "low_1m": w.low, "declined_1m": w.dec,
			"cards_1m": w.dist, "cards_exact": nil, "ms_since_previous": w.msp, "late": false,
			"source_topic": "payments", "source_partition": int64(w.src.Partition), "source_offset": w.src.Offset,
		}
		got := dev[w.src]
		if !reflect.DeepEqual(got.Features, want) {
			t.Errorf("device row %v:\n got  %v\n want %v", w.src, got.Features, want)
		}
		if got.Over["cards"] != w.over {
			t.Errorf("device row %v: cards over max_exact %v, want %v", w.src, got.Over["cards"], w.over)
		}
	}
	if g := ref.Groups["device"]; g.Rows != 9 || g.NoKey != 2 || g.Key != "device_id" || g.InPlace || !maps.Equal(g.Distinct, map[string]int{"cards": 2}) {
		t.Errorf("device summary %+v", g)
	}
	if !maps.Equal(ref.Dead, map[string]int{"duplicate": 1, "late": 1, "invalid:amount": 1, "invalid:device_id": 1}) {
		t.Errorf("dead counts %v", ref.Dead)
	}
}

// recorder is a testing.TB that records failures instead of failing, so that
// the tests can hold the comparison helpers to what they must catch.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...); runtime.Goexit() }
func (r *recorder) Fatal(args ...any)                 { r.Errorf("%s", fmt.Sprint(args...)); runtime.Goexit() }

// capture runs f with a recorder and returns what it recorded.
func capture(t *testing.T, f func(tb testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r.errors
}

// TestCompareGroup holds CompareGroup and CompareDeadLetters to the mismatches
// they exist to catch, on a reference built in memory.
func TestCompareGroup(t *testing.T) {
	row := func(off int64, n, dist int64, exact bool) map[string]any {
		return map[string]any{"event_id": fmt.Sprint("e", off), "entity_id": "d", "n_1m": n, "cards_1m": dist, "cards_exact": exact,
			"source_partition": int64(1), "source_offset": off}
	}
	refRow := func(off int64, n, dist int64, over bool) ReferenceLine {
		f := row(off, n, dist, false)
		f["cards_exact"] = nil
		return ReferenceLine{Partition: 1, Offset: off, Features: f, Over: map[string]bool{"cards": over}}
	}
	ref := GroupReference{
		InPlace: "card",
		Inputs:  map[Source]ReferenceLine{{1, 0}: {Partition: 1}, {1, 1}: {Partition: 1, Offset: 1}, {1, 2}: {Partition: 1, Offset: 2, Dead: "late"}, {1, 3}: {Partition: 1, Offset: 3}},
		Rows:    map[string]map[Source]ReferenceLine{"device": {{1, 0}: refRow(0, 1, 1, false), {1, 1}: refRow(1, 2, 100, true)}},
		Groups:  map[string]GroupSummary{"device": {Distinct: map[string]int{"cards": 64}}},
	}
	good := func() []map[string]any { return []map[string]any{row(0, 1, 1, true), row(1, 2, 100, true)} }
	tests := []struct {
		name    string
		rows    func() []map[string]any
		wantErr string // "" for none
		stats   RowStats
	}{
		{"equal", good, "", RowStats{Rows: 2, Exact: 2}},
		{"an equal repeat", func() []map[string]any { return append(good(), row(1, 2, 100, true)) }, "", RowStats{Rows: 2, Repeats: 1, Exact: 2}},
		{"a repeat that differs", func() []map[string]any { return append(good(), row(1, 3, 100, true)) }, "repeated row differs", RowStats{}},
		{"a field differs", func() []map[string]any { r := good(); r[0]["n_1m"] = int64(2); return r }, "want", RowStats{}},
		{"a row missing", func() []map[string]any { return good()[:1] }, "no row", RowStats{}},
		{"a row for a refused record", func() []map[string]any { return append(good(), row(2, 1, 1, true)) }, "refuses (late)", RowStats{}},
		{"a row the reference does not have", func() []map[string]any { return append(good(), row(3, 1, 1, true)) }, "does not have", RowStats{}},
		{"an estimate within the bound", func() []map[string]any {
			r := good()
			r[1]["cards_1m"] = int64(110)
			r[1]["cards_exact"] = false
			return r
		}, "", RowStats{Rows: 2, Exact: 1, Estimates: 1}},
		{"an estimate beyond the bound", func() []map[string]any {
			r := good()
			r[1]["cards_1m"] = int64(300)
			r[1]["cards_exact"] = false
			return r
		}, "beyond the error bound", RowStats{}},
		{"an estimate where the key never went over", func() []map[string]any { r := good(); r[0]["cards_exact"] = false; return r }, "never held more", RowStats{}},
		{"no source", func() []map[string]any { r := good(); delete(r[0], "source_offset"); return r }, "without int64", RowStats{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st RowStats
			errs := capture(t, func(tb testing.TB) { st = ref.CompareGroup(tb, "device", tc.rows()) })
			switch {
			case tc.wantErr == "" && len(errs) > 0:
				t.Fatalf("unexpected mismatches: %q", errs)
			case tc.wantErr != "" && !strings.Contains(strings.Join(errs, "\n"), tc.wantErr):
				t.Fatalf("mismatches %q, want one containing %q", errs, tc.wantErr)
			case tc.wantErr == "" && st != tc.stats:
				t.Fatalf("stats %+v, want %+v", st, tc.stats)
			}
		})
	}

	deadTests := []struct {
		name    string
		dead    map[Source]string
		wantErr string
	}{
		{"equal", map[Source]string{{1, 2}: "late"}, ""},
		{"missing", map[Source]string{}, "got none"},
		{"another reason", map[Source]string{{1, 2}: "duplicate"}, "want late"},
		{"an accepted record", map[Source]string{{1, 2}: "late", {1, 0}: "late"}, "accepts"},
		{"not an input", map[Source]string{{1, 2}: "late", {2, 0}: "late"}, "not an input"},
	}
	for _, tc := range deadTests {
		t.Run("dead/"+tc.name, func(t *testing.T) {
			errs := capture(t, func(tb testing.TB) { ref.CompareDeadLetters(tb, tc.dead) })
			if (tc.wantErr == "") != (len(errs) == 0) || (tc.wantErr != "" && !strings.Contains(strings.Join(errs, "\n"), tc.wantErr)) {
				t.Fatalf("mismatches %q, want %q", errs, tc.wantErr)
			}
		})
	}
}

// TestPaymentStream holds the generator to the shape its comment promises and
// runs the reference over it with testdata/payment_groups.yaml: every dead
// letter reason, keys missing for each group, ties across partitions, one event
// id counted on two partitions, and keys beyond max_exact in both groups.
func TestPaymentStream(t *testing.T) {
	cfg := PaymentStreamConfig{Seed: 5}
	s := PaymentStream(cfg)
	if again := PaymentStream(cfg); !reflect.DeepEqual(s, again) {
		t.Fatal("the same config gave another stream")
	}
	if other := PaymentStream(PaymentStreamConfig{Seed: 6}); reflect.DeepEqual(s.Parts, other.Parts) {
		t.Fatal("another seed gave the same stream")
	}
	if s.Len() != 6000 || len(s.Parts) != 3 {
		t.Fatalf("%d records on %d partitions, want 6000 on 3", s.Len(), len(s.Parts))
	}
	str := func(v any) (string, bool) { // a ["null","string"] value
		if v == nil {
			return "", false
		}
		return v.(map[string]any)["string"].(string), true
	}
	cards, hotCards := map[string]bool{}, map[string]bool{}
	var hotIP, nullDev, emptyDev, nullIP, emptyIP, thousandths int
	idParts := map[string]map[int]int{}
	for p, recs := range s.Parts {
		if len(recs) < 1000 {
			t.Errorf("partition %d has %d records", p, len(recs))
		}
		for i, r := range recs {
			card := r["card"].(map[string]any)["id"].(string)
			if card != "" && s.Keys[p][i] != card {
				t.Fatalf("partition %d offset %d: key %q for card %q", p, i, s.Keys[p][i], card)
			}
			cards[card] = true
			switch d, ok := str(r["device_id"]); {
			case !ok:
				nullDev++
			case d == "":
				emptyDev++
			case d == HotDevice:
				hotCards[card] = true
			}
			switch ip, ok := str(r["ip"]); {
			case !ok:
				nullIP++
			case ip == "":
				emptyIP++
			case ip == HotIP:
				hotIP++
			}
			if m := new(big.Rat).Mul(r["amount"].(*big.Rat), big.NewRat(100, 1)); !m.IsInt() {
				thousandths++
			}
			id := r["txn_id"].(string)
			if idParts[id] == nil {
				idParts[id] = map[int]int{}
			}
			idParts[id][p]++
		}
	}
	for key, p := range s.Keys {
		for i, k := range p {
			if k != "" {
				if got := int(repartition.PartitionFor(k, int32(len(s.Parts)))); got != key {
					t.Fatalf("record %d of partition %d: card %q belongs to partition %d", i, key, k, got)
				}
			}
		}
	}
	n := float64(s.Len())
	if share := float64(len(hotCards)) / float64(len(cards)); share < 0.22 || share > 0.38 {
		t.Errorf("%s is used by %.2f of the cards, want about 0.3", HotDevice, share)
	}
	if share := float64(hotIP) / n; share < 0.15 || share > 0.25 {
		t.Errorf("%s carries %.2f of the records, want about 0.2", HotIP, share)
	}
	sameOnPartition, acrossPartitions := 0, 0
	for _, ps := range idParts {
		if len(ps) > 1 {
			acrossPartitions++
		}
		for _, c := range ps {
			if c > 1 {
				sameOnPartition++
			}
		}
	}
	for name, c := range map[string]int{"null device_id": nullDev, "empty device_id": emptyDev, "null ip": nullIP, "empty ip": emptyIP,
		"amount with a thousandth": thousandths, "id repeated on a partition": sameOnPartition, "id on two partitions": acrossPartitions} {
		if c < 10 {
			t.Errorf("%d records with %s", c, name)
		}
	}
	t.Logf("%d cards, %d on %s; %.3f of records on %s; device null %d empty %d; ip null %d empty %d; %d ids repeated on a partition, %d on two",
		len(cards), len(hotCards), HotDevice, float64(hotIP)/n, HotIP, nullDev, emptyDev, nullIP, emptyIP, sameOnPartition, acrossPartitions)

	RequireReference(t)
	ref := RunGroupReference(t, referenceScript, PaymentGroupsFile, writePartitions(t, s.Parts), 5*time.Second, "payments")
	for _, r := range []string{"duplicate", "late", "invalid:amount", "invalid:txn_id", "invalid:card.id", "invalid:ts", "invalid:device_id", "invalid:ip"} {
		if ref.Dead[r] == 0 {
			t.Errorf("no %s dead letter: the stream does not exercise it", r)
		}
	}
	t.Logf("dead letters %v", ref.Dead)
	for _, g := range []struct {
		name, hot, distinct string
	}{{"device", HotDevice, "distinct_cards"}, {"ip", HotIP, "cards"}} {
		sum := ref.Groups[g.name]
		rows := ref.Rows[g.name]
		if sum.NoKey < 100 || len(rows) != sum.Rows || sum.Rows < 3000 {
			t.Errorf("group %s: %+v, %d rows", g.name, sum, len(rows))
		}
		parts, over, ties := map[int32]bool{}, 0, 0
		seen := map[[2]any]int32{} // (key, time) -> partition of a row
		for src, l := range rows {
			parts[src.Partition] = true
			if l.Features["entity_id"] == g.hot && l.Over[g.distinct] {
				over++
			}
			k := [2]any{l.Features["entity_id"], l.Features["event_time"]}
			if p, ok := seen[k]; ok && p != src.Partition {
				ties++
			}
			seen[k] = src.Partition
		}
		if len(parts) != 3 || over == 0 || ties == 0 {
			t.Errorf("group %s: rows from partitions %v, %d rows of %s beyond max_exact, %d ties across partitions", g.name, parts, over, g.hot, ties)
		}
		t.Logf("group %s: %d rows, %d without a key, %d rows of %s beyond max_exact, %d same-key same-time ties across partitions", g.name, sum.Rows, sum.NoKey, over, g.hot, ties)
	}
	twice := 0
	byID := map[string]map[int32]bool{}
	for src, l := range ref.Rows[ref.InPlace] {
		id := l.Features["event_id"].(string)
		if byID[id] == nil {
			byID[id] = map[int32]bool{}
		}
		byID[id][src.Partition] = true
		if len(byID[id]) == 2 {
			twice++
		}
	}
	if twice == 0 {
		t.Error("no event id is counted on two partitions")
	}
}
