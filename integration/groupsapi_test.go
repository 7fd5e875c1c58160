//go:build integration

package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/linkedin/goavro/v2"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/integration/kafkatest"
	"github.com/velocity-consumer/velocity-consumer/internal/streamtest"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/repartition"
)

// groupRow is a published features row of a group with where Kafka put it.
type groupRow struct {
	row             map[string]any
	part            int32 // the output topic's partition
	offset          int64 // and offset
	srcPart, srcOff int64
}

// TestGroupsAPIOnTheBroker runs two `run` instances of payment_groups.yaml (the
// in-place group card, the re-keyed groups device and ip) with the query API on,
// over a correlated, skewed payment stream on the real broker, and holds every
// group's API answers, asked of both instances, to what the group published: for
// every key of every group, asked at the event time of its last published row, the
// answer is that row's feature fields (a group counts a key's events in event-time
// order, so its last row counts them all and nothing later exists); asked at the
// default as_of, the key whose row is its group partition's newest gets that row.
// Both instances answer byte for byte the same, wherever the key's owner is in the
// group's consumer group. The transaction call, with each input record's card,
// device and IP, gets every group's answer of the group endpoint for its key, the
// groups the record has no key for left out.
func TestGroupsAPIOnTheBroker(t *testing.T) {
	t.Parallel()
	addr := kafkatest.Broker(t)
	bin := replayBinary(t)
	def, err := definition.LoadFile(paymentGroupsPath)
	if err != nil {
		t.Fatal(err)
	}
	specs, err := definition.EngineSpecs(def)
	if err != nil {
		t.Fatal(err)
	}
	wantDefinition := def.Version + "@" + def.Hash()
	schema, err := os.ReadFile(paymentSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	const lateness = 5 * time.Second
	const partitions = 3
	stream := streamtest.PaymentStream(streamtest.PaymentStreamConfig{Seed: 77, N: 3000, Partitions: partitions, Cards: 40, Lateness: lateness})
	ctx := kafkatest.Context(t, 6*time.Minute)
	in := kafkatest.CreateTopic(t, addr, partitions, nil)
	recs, err := streamtest.PaymentRecords(in, string(schema), stream)
	if err != nil {
		t.Fatal(err)
	}
	if err := kafkatest.Produce(ctx, replayProducer(t, addr), recs...); err != nil {
		t.Fatal(err)
	}
	semantics := []string{"--features", paymentGroupsPath, "--allowed-lateness", lateness.String(), "--log-level", "warn"}

	// How many rows each group publishes: replay's, which run equals
	// (TestRekeyedGroupsLiveAndReplay).
	dir := t.TempDir()
	outFile := filepath.Join(dir, "out.jsonl")
	args := append([]string{"replay", "--brokers", addr, "--input-topic", in, "--output", outFile, "--dlq", filepath.Join(dir, "dlq.jsonl"), "--quiet"}, semantics...)
	if out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput(); err != nil {
		t.Fatalf("replay: %v\n%s", err, out)
	}
	rowsOf := map[string]int{}
	for _, g := range specs {
		file := outFile
		if g.Name != def.Group {
			file = strings.TrimSuffix(outFile, ".jsonl") + "." + g.Name + ".jsonl"
		}
		rowsOf[g.Name] = len(streamtest.ReadJSONLines(t, file))
	}

	group := kafkatest.Group(t)
	out, dlq := "api-"+group, "api-dlq-"+group
	var bases []string
	for i := range 2 {
		port := kafkatest.FreePorts(t, 1)[0]
		bases = append(bases, "http://127.0.0.1:"+strconv.Itoa(port))
		args := append([]string{"run", "--brokers", addr, "--group", group, "--input-topic", in, "--output-topic", out, "--dlq-topic", dlq,
			"--checkpoint-store", "memory", "--metrics-addr", "", "--idle-timeout", "3s",
			"--api-addr", "127.0.0.1:" + strconv.Itoa(port)}, semantics...)
		cmd := exec.CommandContext(ctx, bin, args...)
		logs := &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
		cmd.WaitDelay = 30 * time.Second
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			err := cmd.Wait()
			if t.Failed() {
				t.Logf("instance %d (%v):\n%s", i, err, logs.String())
			}
		})
	}

	// Every group's rows, and each key's last (its output partition's highest
	// offset: a group publishes a key's rows in the order it counts them).
	adm := kadm.NewClient(kafkatest.Client(t, addr))
	inEnds, err := adm.ListEndOffsets(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	type key struct{ group, key string }
	lastOf := map[key]groupRow{}
	for _, g := range specs {
		topic := out
		if g.Name != def.Group {
			topic += "." + g.Name
		}
		c, err := goavro.NewCodec(feature.AvroSchema(g.Spec))
		if err != nil {
			t.Fatal(err)
		}
		rows := readGroupRows(t, ctx, addr, topic, rowsOf[g.Name], c)
		for _, r := range rows {
			k := key{g.Name, r.row["entity_id"].(string)}
			if l, ok := lastOf[k]; ok && l.part != r.part {
				t.Fatalf("group %s key %s published on partitions %d and %d", g.Name, k.key, l.part, r.part)
			}
			if l, ok := lastOf[k]; !ok || r.offset > l.offset {
				lastOf[k] = r
			}
		}
		t.Logf("group %s: %d rows", g.Name, len(rows))
	}

	specOf := map[string]*feature.Spec{}
	for _, g := range specs {
		specOf[g.Name] = g.Spec
	}
	compare := func(what string, g string, got apiGroupFeatures, row map[string]any) {
		t.Helper()
		if got.Group != g || got.Definition != wantDefinition || !got.Known || got.Pending != 0 {
			t.Errorf("%s: group %q definition %q known %v pending %d", what, got.Group, got.Definition, got.Known, got.Pending)
		}
		if g == def.Group {
			if end, _ := inEnds.Lookup(in, got.Partition); got.LastOffset != end.Offset-1 {
				t.Errorf("%s: last_offset %d, the input partition ends at %d", what, got.LastOffset, end.Offset)
			}
		}
		cols := specOf[g].Columns()
		if len(got.Features)+len(got.Exact) != len(cols) {
			t.Errorf("%s: %d features and %d exact, the record has %d feature fields", what, len(got.Features), len(got.Exact), len(cols))
		}
		for _, c := range cols {
			if c.Window < 0 {
				if e, ok := got.Exact[c.Name]; !ok || e != row[c.Name] {
					t.Errorf("%s: %s = %v (present %v), published %v", what, c.Name, e, ok, row[c.Name])
				}
				continue
			}
			v, ok := got.Features[c.Name]
			switch w := row[c.Name].(type) {
			case nil:
				if !ok || v != nil {
					t.Errorf("%s: %s = %v, published null", what, c.Name, v)
				}
			case int64:
				if !ok || v == nil || *v != w {
					t.Errorf("%s: %s = %v, published %d", what, c.Name, v, w)
				}
			}
		}
	}
	compared, refused := map[string]int{}, map[string]int{}
	for k, l := range lastOf {
		at := l.row["event_time"].(int64)
		path := "/v1/groups/" + k.group + "/entities/" + url.PathEscape(k.key) + "/features?at=" + strconv.FormatInt(at, 10)
		code, body := getAPI(t, ctx, client, bases[0], path)
		code1, body1 := getAPI(t, ctx, client, bases[1], path)
		if code != code1 || code == http.StatusOK && sameGroupAnswer(body, body1, k.group != def.Group) != nil || code != http.StatusOK && !bytes.Equal(body, body1) {
			t.Fatalf("%s %s: instance 0 %d %s, instance 1 %d %s", k.group, k.key, code, body, code1, body1)
		}
		switch code {
		case http.StatusOK:
			var got apiGroupFeatures
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if got.AsOf != at || got.Partition != repartition.PartitionFor(k.key, partitions) {
				t.Fatalf("%s %s: as_of %d partition %d, want %d and %d", k.group, k.key, got.AsOf, got.Partition, at, repartition.PartitionFor(k.key, partitions))
			}
			compare(fmt.Sprintf("%s %s at its last row's time %d", k.group, k.key, at), k.group, got, l.row)
			compared[k.group]++
		case http.StatusUnprocessableEntity:
			var e struct{ Error struct{ Code string } }
			if json.Unmarshal(body, &e) != nil || e.Error.Code != "at_out_of_range" {
				t.Fatalf("%s %s at %d: 422 %s", k.group, k.key, at, body)
			}
			refused[k.group]++
		default:
			t.Fatalf("%s %s: %d %s", k.group, k.key, code, body)
		}
	}
	for _, g := range specs {
		// Few cards, so that many keys have a row after their partition's last
		// sweep; the others are refused as docs/api.md says.
		if compared[g.Name] < 5 {
			t.Fatalf("group %s: %d keys compared, %d refused: too few to say much", g.Name, compared[g.Name], refused[g.Name])
		}
		t.Logf("group %s: %d keys' answers equal their last published row, %d refused as before the last sweep", g.Name, compared[g.Name], refused[g.Name])
	}

	// The default as_of: each group partition's newest row, when one row alone is
	// at the newest time.
	type gp struct {
		group string
		p     int32
	}
	newest, ties := map[gp]groupRow{}, map[gp]bool{}
	for k, l := range lastOf {
		i := gp{k.group, repartition.PartitionFor(k.key, partitions)}
		n, ok := newest[i]
		at := l.row["event_time"].(int64)
		switch {
		case !ok || at > n.row["event_time"].(int64):
			newest[i], ties[i] = l, false
		case at == n.row["event_time"].(int64):
			ties[i] = true
		}
	}
	for i, l := range newest {
		if ties[i] {
			continue
		}
		k := l.row["entity_id"].(string)
		code, body := getAPI(t, ctx, client, bases[1], "/v1/groups/"+i.group+"/entities/"+url.PathEscape(k)+"/features")
		var got apiGroupFeatures
		if code != http.StatusOK || json.Unmarshal(body, &got) != nil {
			t.Fatalf("%s %s (newest of partition %d): %d %s", i.group, k, i.p, code, body)
		}
		if got.AsOf != l.row["event_time"].(int64) {
			t.Fatalf("%s %s: default as_of %d, the partition's newest row is at %v", i.group, k, got.AsOf, l.row["event_time"])
		}
		compare(fmt.Sprintf("%s %s at the default as_of", i.group, k), i.group, got, l.row)
	}

	// The transaction call, with the keys of input records.
	calls, entries := 0, 0
	for p, part := range stream.Parts {
		for j := 0; j < len(part); j += 7 {
			rec := part[j]
			keys := map[string]any{"card": rec["card"].(map[string]any)["id"], "device": unionString(rec["device_id"]), "ip": unionString(rec["ip"])}
			body, _ := json.Marshal(map[string]any{"keys": keys})
			var answers [][]byte
			for _, base := range bases {
				code, got := postAPI(t, ctx, client, base+"/v1/transaction/features", body)
				if code != http.StatusOK {
					t.Fatalf("partition %d record %d: %d %s", p, j, code, got)
				}
				answers = append(answers, got)
			}
			if err := sameTransactionAnswers(answers[0], answers[1], def.Group); err != nil {
				t.Fatalf("transaction %s: %v: instance 0 %s\ninstance 1 %s", body, err, answers[0], answers[1])
			}
			var got struct {
				Groups map[string]json.RawMessage `json:"groups"`
			}
			if err := json.Unmarshal(answers[0], &got); err != nil {
				t.Fatal(err)
			}
			for g, kv := range keys {
				k, _ := kv.(string)
				entry, asked := got.Groups[g]
				if k == "" {
					if asked {
						t.Fatalf("transaction %s: group %s has no key, answered %s", body, g, entry)
					}
					continue
				}
				if !asked {
					t.Fatalf("transaction %s: no entry for %s", body, g)
				}
				var e struct {
					Status   int             `json:"status"`
					Features json.RawMessage `json:"features"`
					Error    *struct{ Code string }
				}
				if err := json.Unmarshal(entry, &e); err != nil {
					t.Fatal(err)
				}
				if len(k) > 256 {
					if e.Status != 400 || e.Error == nil || e.Error.Code != "invalid_entity_id" {
						t.Fatalf("transaction %s: %s's over-long key answered %s", body, g, entry)
					}
					continue
				}
				code, single := getAPI(t, ctx, client, bases[0], "/v1/groups/"+g+"/entities/"+url.PathEscape(k)+"/features")
				if e.Status != code || (code == 200 && sameGroupAnswer(e.Features, single, g != def.Group) != nil) {
					t.Fatalf("transaction %s: %s answered %s; the group endpoint %d %s", body, g, entry, code, single)
				}
				entries++
			}
			calls++
		}
	}
	if len(lastOf) == 0 || entries < 2*calls {
		t.Fatalf("%d transaction calls, %d entries compared", calls, entries)
	}
	t.Logf("%d transaction calls on both instances, %d entries equal the group endpoint's answers", calls, entries)
	_, example := getAPI(t, ctx, client, bases[0], "/v1/groups/device/entities/"+streamtest.HotDevice+"/features")
	t.Logf("an answer: %s", example)
}

type apiGroupFeatures struct {
	Group string `json:"group"`
	apiFeatures
}

// unionString reads a string field of a native goavro record, a nullable union
// ({"string": v} or nil) or a plain string.
func unionString(v any) any {
	switch x := v.(type) {
	case string:
		return x
	case map[string]any:
		return x["string"]
	}
	return nil
}

// readGroupRows reads n features records of a group's topic with their Kafka
// position.
func readGroupRows(t *testing.T, ctx context.Context, addr, topic string, n int, c *goavro.Codec) []groupRow {
	t.Helper()
	cl := kafkatest.Client(t, addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var rows []groupRow
	seen := map[[2]int64]bool{}
	for len(seen) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("%s: read %d of %d rows before the deadline: %v", topic, len(seen), n, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			nat, _, err := c.NativeFromBinary(r.Value)
			if err != nil {
				t.Fatalf("%s at %d: %v", topic, r.Offset, err)
			}
			row := streamtest.FlatNative(nat.(map[string]any))
			gr := groupRow{row: row, part: r.Partition, offset: r.Offset, srcPart: row["source_partition"].(int64), srcOff: row["source_offset"].(int64)}
			seen[[2]int64{gr.srcPart, gr.srcOff}] = true
			rows = append(rows, gr)
		})
	}
	return rows
}

// getAPI GETs path of base, retrying a 503 (the groups settling) until ctx ends.
func getAPI(t *testing.T, ctx context.Context, client *http.Client, base, path string) (int, []byte) {
	t.Helper()
	return retry503(t, ctx, func() (*http.Response, error) { return client.Get(base + path) })
}

func postAPI(t *testing.T, ctx context.Context, client *http.Client, u string, body []byte) (int, []byte) {
	t.Helper()
	for {
		code, got := retry503(t, ctx, func() (*http.Response, error) {
			return client.Post(u, "application/json", bytes.NewReader(body))
		})
		// An entry of a group still settling is that entry's 503: ask again.
		if code == http.StatusOK && bytes.Contains(got, []byte(`"status":503`)) {
			select {
			case <-ctx.Done():
				t.Fatalf("POST %s: an entry still 503 at the deadline: %s", u, got)
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		return code, got
	}
}

func retry503(t *testing.T, ctx context.Context, do func() (*http.Response, error)) (int, []byte) {
	t.Helper()
	for {
		resp, err := do()
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusServiceUnavailable {
				return resp.StatusCode, body
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no answer but 503 before the deadline (%v)", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sameTransactionAnswers holds two instances' answers to one transaction call,
// asked one after the other while the input is quiet, to the same values: every
// group's entry alike (sameGroupAnswer).
func sameTransactionAnswers(first, second []byte, inPlace string) error {
	var a, b struct {
		Groups map[string]json.RawMessage `json:"groups"`
	}
	if err := json.Unmarshal(first, &a); err != nil {
		return err
	}
	if err := json.Unmarshal(second, &b); err != nil {
		return err
	}
	if len(a.Groups) != len(b.Groups) {
		return fmt.Errorf("%d groups, then %d", len(a.Groups), len(b.Groups))
	}
	for g, ea := range a.Groups {
		var fa, fb struct {
			Status   int             `json:"status"`
			Features json.RawMessage `json:"features"`
		}
		if err := json.Unmarshal(ea, &fa); err != nil {
			return err
		}
		if err := json.Unmarshal(b.Groups[g], &fb); err != nil {
			return fmt.Errorf("group %s: %w", g, err)
		}
		if fa.Features == nil || fb.Features == nil {
			if !bytes.Equal(ea, b.Groups[g]) {
				return fmt.Errorf("group %s differs", g)
			}
			continue
		}
		if fa.Status != fb.Status {
			return fmt.Errorf("group %s: status %d, then %d", g, fa.Status, fb.Status)
		}
		if err := sameGroupAnswer(fa.Features, fb.Features, g != inPlace); err != nil {
			return fmt.Errorf("group %s: %w", g, err)
		}
	}
	return nil
}

// sameGroupAnswer holds two answers for one key of a group, asked one after the
// other while the input is quiet, to the same values. A re-keyed group's
// last_offset, its second stage's position in the repartition partition, is the
// exception: the quiet input partitions' idle lease renewals move it on
// (docs/repartition.md), so the later answer's may be further, never behind.
func sameGroupAnswer(first, second []byte, reKeyed bool) error {
	var a, b map[string]any
	if err := json.Unmarshal(first, &a); err != nil {
		return err
	}
	if err := json.Unmarshal(second, &b); err != nil {
		return err
	}
	if reKeyed {
		la, _ := a["last_offset"].(float64)
		lb, _ := b["last_offset"].(float64)
		if lb < la {
			return fmt.Errorf("last_offset %v, then %v", la, lb)
		}
		delete(a, "last_offset")
		delete(b, "last_offset")
	}
	if !reflect.DeepEqual(a, b) {
		return errors.New("the answers differ")
	}
	return nil
}
