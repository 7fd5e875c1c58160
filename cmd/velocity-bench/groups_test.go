package main

import (
	"bytes"
	"math"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.yaml.in/yaml/v3"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

func TestParseProcSpecGroups(t *testing.T) {
	for _, c := range []struct {
		spec   string
		groups int
		eos    bool
		ok     bool
	}{
		{"ours:groups=1", 1, false, true},
		{"ours:late=2s:groups=3", 3, false, true},
		{"kstreams:groups=2", 2, false, true},
		{"kstreams:eos:groups=3", 3, true, true},
		{"ours", 0, false, true},
		{"ours:groups=0", 0, false, false},
		{"ours:groups=4", 0, false, false},
		{"ours:groups=x", 0, false, false},
		{"ours:groups=", 0, false, false},
		{"ours:groups=1:groups=2", 0, false, false},
		{"floor:groups=1", 0, false, false},
	} {
		p, err := ParseProcSpec(c.spec)
		if (err == nil) != c.ok {
			t.Errorf("ParseProcSpec(%q) error %v, want ok=%v", c.spec, err, c.ok)
			continue
		}
		if c.ok && (p.Groups != c.groups || p.EOS != c.eos) {
			t.Errorf("ParseProcSpec(%q) = groups %d eos %v, want %d %v", c.spec, p.Groups, p.EOS, c.groups, c.eos)
		}
	}
}

func TestWorkloadFormat(t *testing.T) {
	specs := func(s string) []ProcSpec {
		ps, err := ParseProcSpecs(s)
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	for _, c := range []struct {
		workload, procs string
		format          string
		ok              bool
	}{
		{"transactions", "ours,kstreams:eos,floor", "", true},
		{"payments", "ours:groups=1,kstreams:groups=3,floor", FormatPayments, true},
		{"payments", "ours:groups=2,ours", "", false},
		{"transactions", "kstreams:groups=1", "", false},
		{"json", "ours", "", false},
		{"payments", "", FormatPayments, true},
	} {
		f, err := workloadFormat(c.workload, specs(c.procs))
		if (err == nil) != c.ok || (c.ok && f != c.format) {
			t.Errorf("workloadFormat(%q, %q) = %q, %v; want %q ok=%v", c.workload, c.procs, f, err, c.format, c.ok)
		}
	}
	w := DefaultWorkload(10, 1)
	w.Format = "csv"
	if w.Validate() == nil {
		t.Error("Validate accepted format csv")
	}
}

func TestAppendDecimal(t *testing.T) {
	for _, c := range []struct {
		v    int64
		want []byte // Java's BigInteger.valueOf(v).toByteArray()
	}{
		{0, []byte{0}},
		{1, []byte{1}},
		{127, []byte{0x7f}},
		{128, []byte{0x00, 0x80}},
		{255, []byte{0x00, 0xff}},
		{256, []byte{0x01, 0x00}},
		{2500, []byte{0x09, 0xc4}},
		{-1, []byte{0xff}},
		{-128, []byte{0x80}},
		{-129, []byte{0xff, 0x7f}},
		{1_000_000_000, []byte{0x3b, 0x9a, 0xca, 0x00}},
		{math.MaxInt64, []byte{0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{math.MinInt64, []byte{0x80, 0, 0, 0, 0, 0, 0, 0}},
	} {
		want := codec.AppendLong(nil, int64(len(c.want)))
		want = append(want, c.want...)
		if got := appendDecimal(nil, c.v); !bytes.Equal(got, want) {
			t.Errorf("appendDecimal(%d) = % x, want % x", c.v, got, want)
		}
	}
}

func TestAppendPaddedAndIDs(t *testing.T) {
	for _, c := range []struct {
		v     uint32
		width int
		want  string
	}{
		{0, 1, "0"}, {7, 3, "007"}, {123456, 6, "123456"}, {1234567, 6, "1234567"}, {4294967295, 1, "4294967295"},
	} {
		if got := string(appendPadded(nil, c.v, c.width)); got != c.want {
			t.Errorf("appendPadded(%d, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
	if got := string(appendDeviceID(nil, 42)); got != "dev-000042" {
		t.Errorf("device 42 = %q", got)
	}
}

// The payments records are what the schema says: goavro decodes them, and the fields
// are the generator's event, its device and its IP.
func TestPaymentRecordsDecode(t *testing.T) {
	codecAvro, err := goavro.NewCodec(paymentEventSchema)
	if err != nil {
		t.Fatal(err)
	}
	w := DefaultWorkload(1000, 2000)
	w.Format = FormatPayments
	g, err := NewGenerator(w)
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, ok := g.Next()
		if !ok {
			break
		}
		ts := w.EventTime(g.Index(), ev.DisorderMs)
		rec := g.Record(ev, ts)
		if string(rec.Key) != EntityID(ev.Entity) {
			t.Fatalf("event %d key %q, want %q", g.Index(), rec.Key, EntityID(ev.Entity))
		}
		native, rest, err := codecAvro.NativeFromBinary(rec.Value)
		if err != nil || len(rest) != 0 {
			t.Fatalf("event %d: goavro: %v (%d bytes left)", g.Index(), err, len(rest))
		}
		m := native.(map[string]any)
		card := m["card"].(map[string]any)["id"].(string)
		dev := m["device_id"].(map[string]any)["string"].(string)
		ip := m["ip"].(map[string]any)["string"].(string)
		if amt, ok := m["amount"].(*big.Rat); !ok || amt.Cmp(big.NewRat(ev.AmountMin, 100)) != 0 {
			t.Fatalf("event %d amount %v, want %d/100", g.Index(), m["amount"], ev.AmountMin)
		}
		if m["txn_id"] != string(ev.ID[:]) || card != EntityID(ev.Entity) || m["status"] != "APPROVED" ||
			m["merchant"] != nil || m["card"].(map[string]any)["bin"] != nil ||
			m["ts"].(time.Time).UnixMicro() != ts*1000 || dev != string(appendDeviceID(nil, deviceOf(ev.Entity))) {
			t.Fatalf("event %d decodes as %v, want id %s card %s ts %d", g.Index(), m, ev.ID[:], EntityID(ev.Entity), ts)
		}
		if want := string(appendIP(nil, w.Seed, g.Index(), deviceOf(ev.Entity))); ip != want {
			t.Fatalf("event %d ip %q, want %q", g.Index(), ip, want)
		}
	}
}

// The device and IP keys are shaped as the groups benchmark needs: a device shared by
// cardsPerDevice cards, a hot IP with about hotIPPermille ‰ of the events, and the
// stream of cards and amounts the transactions workload's.
func TestPaymentKeysShape(t *testing.T) {
	w := DefaultWorkload(100_000, 200_000)
	pw := w
	pw.Format = FormatPayments
	a, _ := NewGenerator(w)
	b, _ := NewGenerator(pw)
	cardsOf := map[string]map[uint32]bool{}
	ips := map[string]int{}
	for {
		ea, oka := a.Next()
		eb, okb := b.Next()
		if oka != okb || ea != eb {
			t.Fatalf("event %d: the payments workload's events differ from the transactions workload's", a.Index())
		}
		if !oka {
			break
		}
		dev := string(appendDeviceID(nil, deviceOf(eb.Entity)))
		if cardsOf[dev] == nil {
			cardsOf[dev] = map[uint32]bool{}
		}
		cardsOf[dev][eb.Entity] = true
		ips[string(appendIP(nil, pw.Seed, b.Index(), deviceOf(eb.Entity)))]++
	}
	most, shared := 0, 0
	for _, cs := range cardsOf {
		most = max(most, len(cs))
		if len(cs) > 1 {
			shared++
		}
	}
	if most > cardsPerDevice || most < cardsPerDevice/2 {
		t.Errorf("most cards on one device %d, want up to %d", most, cardsPerDevice)
	}
	if shared < len(cardsOf)/2 {
		t.Errorf("%d of %d devices are shared by several cards, want most", shared, len(cardsOf))
	}
	// 5 % of 200 000: 10 000 expected, binomial sd ≈ 97.
	if n := ips[hotIP]; n < 9_500 || n > 10_500 {
		t.Errorf("hot IP has %d of %d events, want about %d ‰", n, w.Events, hotIPPermille)
	}
	second := 0
	for ip, n := range ips {
		if ip != hotIP {
			second = max(second, n)
		}
	}
	if second*2 > ips[hotIP] { // the hottest card (~1.7 %) makes its IP the next busiest
		t.Errorf("the next busiest IP has %d events, the hot one %d: not hot", second, ips[hotIP])
	}
}

// The one-group definition runs on this build: it parses, compiles against the
// schema, and decodes a payments record to the transaction the generator made. Each
// group's own spec compiles too, and keys its rows by that group's field.
func TestGroupsDefinitionsDecodePayments(t *testing.T) {
	w := DefaultWorkload(1000, 50)
	w.Format = FormatPayments
	g, _ := NewGenerator(w)
	ev, _ := g.Next()
	ts := w.EventTime(0, ev.DisorderMs)
	rec := g.Record(ev, ts)
	src, err := GroupsDefinition(1)
	if err != nil {
		t.Fatal(err)
	}
	sources := []struct {
		name, yaml, wantEntity string
	}{
		{"groups=1", src, EntityID(ev.Entity)},
		{"card", inputYAML(benchGroups[0].Key) + benchGroups[0].featuresYAML(""), EntityID(ev.Entity)},
		{"device", inputYAML(benchGroups[1].Key) + benchGroups[1].featuresYAML(""), string(appendDeviceID(nil, deviceOf(ev.Entity)))},
		{"ip", inputYAML(benchGroups[2].Key) + benchGroups[2].featuresYAML(""), string(appendIP(nil, w.Seed, 0, deviceOf(ev.Entity)))},
	}
	for _, s := range sources {
		d, err := definition.Parse(s.name+".yaml", []byte(s.yaml))
		if err != nil {
			t.Fatalf("%s: %v\n%s", s.name, err, s.yaml)
		}
		c, err := definition.Compile(d, paymentEventSchema, codec.Limits{})
		if err != nil {
			t.Fatalf("%s: compile against payment_event.avsc: %v", s.name, err)
		}
		var tx codec.Transaction
		if rej := c.Decoder().Decode(rec.Value, 0, false, &tx); rej != nil {
			t.Fatalf("%s: record rejected: %+v", s.name, rej)
		}
		if tx.EntityID != s.wantEntity || tx.EventID != string(ev.ID[:]) || tx.AmountMinor != ev.AmountMin || tx.EventTime != ts {
			t.Errorf("%s: decoded %+v, want entity %s, id %s, amount %d, time %d", s.name, tx, s.wantEntity, ev.ID[:], ev.AmountMin, ts)
		}
	}
}

// The definitions of 2 and 3 groups are the seams' format (docs/repartition.md): the
// in-place group named, then each re-keyed group with its key, windows and features,
// as benchGroups has them. Checked as YAML, so that it holds before and after this
// build's definition parser learns `groups:`.
func TestGroupsDefinitionShape(t *testing.T) {
	type feat struct {
		Name, Agg, Field string
		Windows          []string
	}
	type grp struct {
		Name, Key string
		Windows   []string
		Features  []feat
	}
	type def struct {
		Version  string
		Group    string
		Input    map[string]any
		Windows  []string
		Features []feat
		Groups   []grp
	}
	for _, c := range []struct {
		n  int
		ok bool
	}{{0, false}, {1, true}, {2, true}, {3, true}, {4, false}} {
		src, err := GroupsDefinition(c.n)
		if (err == nil) != c.ok {
			t.Errorf("GroupsDefinition(%d) error %v, want ok=%v", c.n, err, c.ok)
			continue
		}
		if !c.ok {
			continue
		}
		var d def
		dec := yaml.NewDecoder(strings.NewReader(src))
		dec.KnownFields(true)
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("groups=%d: %v\n%s", c.n, err, src)
		}
		if d.Input["entity_id"] != "card.id" || !reflect.DeepEqual(d.Windows, benchGroups[0].Windows) {
			t.Errorf("groups=%d: in-place group keyed %v over %v", c.n, d.Input["entity_id"], d.Windows)
		}
		if len(d.Groups) != c.n-1 || (c.n > 1) != (d.Group == "card") {
			t.Errorf("groups=%d: group %q and %d re-keyed groups", c.n, d.Group, len(d.Groups))
		}
		for i, g := range d.Groups {
			want := benchGroups[i+1]
			if g.Name != want.Name || g.Key != want.Key || !reflect.DeepEqual(g.Windows, want.Windows) {
				t.Errorf("groups=%d: group %d is %+v, want %+v", c.n, i+1, g, want)
			}
			hasDistinct := len(g.Features) == 3 && g.Features[2].Agg == "distinct_count" && g.Features[2].Field == "card.id"
			if len(g.Features) < 2 || g.Features[0].Agg != "count" || g.Features[1].Agg != "sum" || hasDistinct != want.DistinctCards {
				t.Errorf("groups=%d: group %s features %+v", c.n, g.Name, g.Features)
			}
		}
	}
}

// The column layout that VelocityGroups.java writes by hand: attempts per window,
// spend per window, then for device distinct_cards over its last window and its
// _exact flag. A benchGroups change that Java does not follow fails here first.
func TestGroupSpecColumns(t *testing.T) {
	for _, c := range []struct {
		group int
		want  []string
	}{
		{0, []string{"attempts_1m", "attempts_1h", "attempts_24h", "spend_1m", "spend_1h", "spend_24h"}},
		{1, []string{"attempts_5m", "attempts_24h", "spend_5m", "spend_24h", "distinct_cards_24h", "distinct_cards_exact"}},
		{2, []string{"attempts_5m", "attempts_1h", "spend_5m", "spend_1h"}},
	} {
		spec, err := GroupSpec(benchGroups[c.group])
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, col := range spec.Columns() {
			got = append(got, col.Name)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("group %s columns %v, want %v", benchGroups[c.group].Name, got, c.want)
		}
	}
}

func TestGroupTopicsAndNames(t *testing.T) {
	for n, want := range map[int][]string{
		1: {"out"},
		2: {"out", "out.device"},
		3: {"out", "out.device", "out.ip"},
	} {
		if got := GroupTopics("out", n); !reflect.DeepEqual(got, want) {
			t.Errorf("GroupTopics(out, %d) = %v, want %v", n, got, want)
		}
	}
	for _, c := range []struct{ in, want string }{
		{"ours:groups=3", "ours:groups=1"},
		{"kstreams:eos:groups=2", "kstreams:eos:groups=1"},
		{"ours:eos", ""},
	} {
		if got := withGroups(c.in, 1); got != c.want {
			t.Errorf("withGroups(%q, 1) = %q, want %q", c.in, got, c.want)
		}
	}
	procs := []string{"ours", "ours:eos", "ours:groups=2", "ours:eos:groups=2", "ours:groups=3"}
	for _, c := range []struct{ peer, want string }{
		{"kstreams", "ours"},
		{"kstreams:eos", "ours:eos"},
		{"kstreams:groups=2", "ours:groups=2"},
		{"kstreams:eos:groups=2", "ours:eos:groups=2"},
		{"kstreams:eos:groups=3", "ours:groups=3"},
		{"kstreams:groups=1", ""},
	} {
		if got := refFor(c.peer, procs); got != c.want {
			t.Errorf("refFor(%q) = %q, want %q", c.peer, got, c.want)
		}
	}
}

func TestWriteGroupsDefinition(t *testing.T) {
	dir := t.TempDir()
	path, err := writeGroupsDefinition(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	d, err := definition.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(d.SchemaFile())
	if err != nil || string(schema) != paymentEventSchema {
		t.Fatalf("schema beside the definition: %v", err)
	}
	if filepath.Dir(path) != dir {
		t.Errorf("definition written to %s, want under %s", path, dir)
	}
	cmd, err := procEnv{VC: "/bin/vc", Jar: "x.jar", Java: "java", Checkpoint: "memory"}.command(
		ProcSpec{Kind: "ours", Groups: 2, Name: "ours:groups=2"}, "in", "out", "dlq", "grp", dir)
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(cmd.Args, " "); !strings.Contains(args, "--features "+filepath.Join(dir, "groups2.yaml")) {
		t.Errorf("ours:groups=2 runs %s", args)
	}
	cmd, err = procEnv{VC: "/bin/vc", Jar: "x.jar", Java: "java"}.command(
		ProcSpec{Kind: "kstreams", Groups: 3, EOS: true, Name: "kstreams:eos:groups=3"}, "in", "out", "dlq", "grp", dir)
	if err != nil {
		t.Fatal(err)
	}
	if a := cmd.Args; a[len(a)-2] != "eos" || a[len(a)-1] != "groups=3" || a[len(a)-5] != "out" {
		t.Errorf("kstreams:eos:groups=3 runs %v", a)
	}
}

// The tally of a groups run: each group answers an input with a row naming its source
// offset or with a dead letter that stands for every group; a row that is not the
// group's record is a bad value; a second answer is a duplicate.
func TestGroupsTally(t *testing.T) {
	specs := make([]*feature.Spec, 3)
	for g := range specs {
		var err error
		if specs[g], err = GroupSpec(benchGroups[g]); err != nil {
			t.Fatal(err)
		}
	}
	topics := GroupTopics("out", 3)
	row := func(g int, key string, off int64) *kgo.Record {
		r := feature.NewRow(specs[g])
		h := feature.Head{EventID: "e", EntityID: key, EventTime: 1, SourceTopic: "in", SourcePartition: 1, SourceOffset: off}
		return &kgo.Record{Topic: topics[g], Value: feature.AppendRow(nil, specs[g], &h, r), Timestamp: time.UnixMilli(1000 + off)}
	}
	dead := func(group string, off int64) *kgo.Record {
		hs := []kgo.RecordHeader{
			{Key: codec.HeaderSourcePartition, Value: []byte("1")},
			{Key: codec.HeaderSourceOffset, Value: []byte(strconv.FormatInt(off, 10))},
			{Key: codec.HeaderReason, Value: []byte("late")},
		}
		if group != "" {
			hs = append(hs, kgo.RecordHeader{Key: headerGroup, Value: []byte(group)})
		}
		return &kgo.Record{Topic: "dlq", Timestamp: time.UnixMilli(5000), Headers: hs}
	}
	for _, c := range []struct {
		name     string
		recs     []*kgo.Record
		answered int
		want     groupsScan
	}{
		{"every group answers both", []*kgo.Record{row(0, "c1", 0), row(1, "d1", 0), row(2, "i1", 0), row(0, "c2", 1), row(1, "d1", 1), row(2, "i1", 1)},
			2, groupsScan{Rows: []int{2, 2, 2}, Keys: []int{2, 1, 1}, Unique: 2, Reasons: map[string]int{}}},
		{"an input partition's dead letter answers for all", []*kgo.Record{row(0, "c1", 0), row(1, "d1", 0), row(2, "i1", 0), dead("", 9)},
			2, groupsScan{Rows: []int{1, 1, 1}, Keys: []int{1, 1, 1}, DeadLetters: 1, Unique: 2, Reasons: map[string]int{"input:late": 1}}},
		{"a second stage's dead letter answers for its group", []*kgo.Record{row(0, "c1", 0), row(1, "d1", 0), row(2, "i1", 0), row(0, "c1", 9), row(2, "i1", 9), dead("device", 9)},
			2, groupsScan{Rows: []int{2, 1, 2}, Keys: []int{1, 1, 1}, DeadLetters: 1, Unique: 2, Reasons: map[string]int{"device:late": 1}}},
		{"a second stage's dead letter does not answer for the others", []*kgo.Record{row(0, "c1", 0), row(1, "d1", 0), row(2, "i1", 0), dead("device", 9)},
			1, groupsScan{Rows: []int{1, 1, 1}, Keys: []int{1, 1, 1}, DeadLetters: 1, Unique: 1, Reasons: map[string]int{"device:late": 1}}},
		{"the slowest group counts", []*kgo.Record{row(0, "c1", 0), row(0, "c2", 1), row(1, "d1", 0)},
			0, groupsScan{Rows: []int{2, 1, 0}, Keys: []int{2, 1, 0}, Unique: 0, Reasons: map[string]int{}}},
		{"duplicate row", []*kgo.Record{row(0, "c1", 0), row(0, "c1", 0)},
			0, groupsScan{Rows: []int{2, 0, 0}, Keys: []int{1, 0, 0}, Dups: 1, Reasons: map[string]int{}}},
		{"another group's row is a bad value", []*kgo.Record{{Topic: topics[2], Value: row(1, "d1", 0).Value}},
			0, groupsScan{Rows: []int{0, 0, 1}, Keys: []int{0, 0, 0}, BadValues: 1, Reasons: map[string]int{}}},
	} {
		tl := newGroupsTally(topics, "dlq", specs)
		for _, r := range c.recs {
			tl.add(r)
		}
		got := tl.result()
		if tl.answered() != c.answered {
			t.Errorf("%s: answered %d, want %d", c.name, tl.answered(), c.answered)
		}
		got.FirstAppend, got.LastAppend = time.Time{}, time.Time{}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

func TestGroupsTable(t *testing.T) {
	run := func(round int, proc string, groups int, cpu, rss float64, keys []int) Result {
		return Result{Round: round, Mode: "throughput", Processor: proc, Entities: 100, Events: 10, Groups: groups,
			CPUSecPerMEvt: cpu, PeakRSSMiB: rss, GroupKeys: keys, GroupRows: make([]int, groups)}
	}
	all := []Result{
		run(1, "ours:groups=1", 1, 2, 100, []int{10}),
		run(1, "ours:groups=2", 1+1, 3, 102, []int{10, 1 << 10}),
		run(2, "ours:groups=1", 1, 4, 100, []int{10}),
		run(2, "ours:groups=2", 2, 5, 104, []int{10, 1 << 10}),
	}
	out := Report(all)
	// CPU ratios per round 1.5 and 1.25: median 1.375 → "1.38"; Δ RSS 2 and 4 MiB,
	// median 3 MiB over 1024 keys: 3072 B per key.
	if !strings.Contains(out, "| ours:groups=2 | 100 | 2 | [0 0] | [10 1024] | 4.00 | 1.38 | 3072 |") {
		t.Errorf("groups table:\n%s", out)
	}
	if !strings.Contains(out, "| ours:groups=1 | 100 | 2 | [0] | [10] | 3.00 | — | — |") {
		t.Errorf("groups=1 row:\n%s", out)
	}
}

// checkPeerRows finds the rows that differ from our engine's, and only those: rows
// computed by the engine itself in arrival order are identical; a changed value, a
// changed gap, a duplicate, a row that does not decode or names no input are each
// reported as such.
func TestCheckPeerRows(t *testing.T) {
	w := DefaultWorkload(200, 3000)
	w.Format = FormatPayments
	w.StepMicros = 1_000_000 // 50 minutes of event time: longer than every group's shortest window
	gen, _ := NewGenerator(w)
	inputs := map[srcKey][]byte{}
	var order []srcKey
	for {
		ev, ok := gen.Next()
		if !ok {
			break
		}
		k := srcKey{int32(gen.Index() % 4), int64(gen.Index() / 4)}
		inputs[k] = gen.Record(ev, w.EventTime(gen.Index(), ev.DisorderMs)).Value
		order = append(order, k)
	}
	for _, g := range benchGroups {
		spec, err := GroupSpec(g)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := definition.Parse("x.yaml", []byte(inputYAML(g.Key)+g.featuresYAML("")))
		comp, err := definition.Compile(d, paymentEventSchema, codec.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		st, _ := feature.NewState(*spec, window.Options{})
		row := feature.NewRow(spec)
		var rows [][]byte
		var tx codec.Transaction
		for _, k := range order {
			if rej := comp.Decoder().Decode(inputs[k], 0, false, &tx); rej != nil {
				t.Fatalf("input %v: %+v", k, rej)
			}
			gap, hasPrev, err := st.Apply(tx.EntityID, tx.EventTime, tx.AmountMinor, tx.Ext, row)
			if err != nil {
				continue // expired: the peer would count it nowhere either
			}
			h := feature.Head{EventID: tx.EventID, EntityID: tx.EntityID, EventTime: tx.EventTime, MsSincePrevious: gap, HasPrevious: hasPrev,
				SourceTopic: "in", SourcePartition: k.P, SourceOffset: k.O}
			rows = append(rows, feature.AppendRow(nil, spec, &h, row))
		}
		res, err := checkPeerRows(g, inputs, rows, 3)
		if err != nil {
			t.Fatal(err)
		}
		if res.Compared != len(rows) || res.Identical != len(rows) || res.Bad+res.Refused+res.Duplicates != 0 {
			t.Errorf("%s: the engine's own rows: %+v", g.Name, res)
		}
		// Tamper with the last row: its last value (spend, or for device the
		// distinct count) off by one.
		last := rows[len(rows)-1]
		var h feature.Head
		pr := feature.NewRow(spec)
		if err := feature.ParseRow(last, spec, &h, pr); err != nil {
			t.Fatal(err)
		}
		pr.Values[len(pr.Values)-1]++
		bent := feature.AppendRow(nil, spec, &h, pr)
		h2 := h
		h2.SourceOffset = 1 << 40 // no such input
		// The peer applies an event of the last row's key far behind the key's newest
		// (a copy of the key's first input, as from another partition): ours refuses
		// it as expired, and the key's next row, which the peer computed with that
		// event counted, is a difference by design, not a bug.
		key := lastKey(t, rows, spec)
		var first []byte
		for _, v := range rows {
			if feature.ParseRow(v, spec, &h, pr) == nil && h.EntityID == key {
				first = inputs[srcKey{h.SourcePartition, h.SourceOffset}]
				break
			}
		}
		if err := feature.ParseRow(last, spec, &h, pr); err != nil {
			t.Fatal(err)
		}
		inputs[srcKey{9, 0}], inputs[srcKey{9, 1}] = first, inputs[srcKey{h.SourcePartition, h.SourceOffset}]
		hx, hy := h, h
		hx.SourcePartition, hx.SourceOffset = 9, 0
		hy.SourcePartition, hy.SourceOffset = 9, 1
		eventOf(t, g, first, &hx)
		expiredRow := feature.AppendRow(nil, spec, &hx, pr) // its values do not matter: refused
		pr.Values[0] += 1000
		afterRow := feature.AppendRow(nil, spec, &hy, pr)
		reordered := append(append([][]byte{}, rows...), expiredRow, afterRow)
		cases := []struct {
			name  string
			rows  [][]byte
			check func(peerCheck) bool
		}{
			{"changed value", append(append([][]byte{}, rows[:len(rows)-1]...), bent), func(r peerCheck) bool {
				return len(r.Differing) == 1 && r.Identical == len(rows)-1 && len(r.Examples) == 1
			}},
			{"duplicate", append(append([][]byte{}, rows...), rows[0]), func(r peerCheck) bool {
				return r.Duplicates == 1 && r.Identical == len(rows)
			}},
			{"truncated", append(append([][]byte{}, rows...), last[:len(last)-1]), func(r peerCheck) bool {
				return r.Bad == 1 && r.Identical == len(rows)
			}},
			{"no such input", append(append([][]byte{}, rows...), feature.AppendRow(nil, spec, &h2, pr)), func(r peerCheck) bool {
				return r.Bad == 1 && r.Identical == len(rows)
			}},
			{"an event far behind the key's newest", reordered, func(r peerCheck) bool {
				return r.Refused == 1 && r.AfterExpired == 1 && len(r.Differing) == 0 && r.Identical == len(rows)
			}},
		}
		for _, c := range cases {
			r, err := checkPeerRows(g, inputs, c.rows, 3)
			if err != nil || !c.check(r) {
				t.Errorf("%s, %s: %+v, %v", g.Name, c.name, r, err)
			}
		}
	}
}

// lastKey is the entity of the last row that decodes.
func lastKey(t *testing.T, rows [][]byte, spec *feature.Spec) string {
	var h feature.Head
	if err := feature.ParseRow(rows[len(rows)-1], spec, &h, feature.NewRow(spec)); err != nil {
		t.Fatal(err)
	}
	return h.EntityID
}

// eventOf sets h's event id and time to those of input value v under g's mapping,
// so that a synthetic row names its input's event.
func eventOf(t *testing.T, g benchGroup, v []byte, h *feature.Head) {
	t.Helper()
	d, err := definition.Parse("x.yaml", []byte(inputYAML(g.Key)+g.featuresYAML("")))
	if err != nil {
		t.Fatal(err)
	}
	c, err := definition.Compile(d, paymentEventSchema, codec.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var tx codec.Transaction
	if rej := c.Decoder().Decode(v, 0, false, &tx); rej != nil {
		t.Fatalf("decode: %+v", rej)
	}
	h.EventID, h.EventTime = tx.EventID, tx.EventTime
}

// TestPaymentSchemaIsTheExample: the embedded copy of the payments workload's schema
// is byte for byte the documented example's, so the benchmark measures the schema
// users read about.
func TestPaymentSchemaIsTheExample(t *testing.T) {
	want, err := os.ReadFile("../../examples/features/payment_event.avsc")
	if err != nil {
		t.Fatal(err)
	}
	if paymentEventSchema != string(want) {
		t.Fatal("cmd/velocity-bench/testdata/payment_event.avsc differs from examples/features/payment_event.avsc: copy the example over it")
	}
}
