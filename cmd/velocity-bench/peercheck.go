package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// cmdGroupsCheck checks that the Kafka Streams groups peer computes what a definition
// of the same groups means: it runs the peer with groups=N over one payments
// workload, then replays every group's rows through our engine (pkg/feature, the
// group's own spec) in the peer's own order, and compares every field but `late`.
// Each group's output topic is keyed and partitioned by the group's key, so a
// partition's rows in offset order are the order the peer applied each key's
// events; applying the same inputs in that order must give the same values. (`late`
// is left out: ours decides it against the input partition's watermark, the peer
// against the key's newest event.)
func cmdGroupsCheck(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("groups-check", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "comma-separated loopback Kafka brokers")
	events := fs.Int("events", 100_000, "events of the payments workload")
	entities := fs.Int("entities", 10_000, "Zipf card count")
	groups := fs.Int("groups", MaxBenchGroups, "groups the peer computes (1..3)")
	eos := fs.Bool("eos", false, "run the peer with exactly_once_v2")
	jar := fs.String("jar", "bench/kstreams/target/velocity-kstreams.jar", "Kafka Streams peer (cd bench/kstreams && mvn -q package)")
	java := fs.String("java", "java", "java executable (17+)")
	javaOpts := fs.String("java-opts", "-Xmx1g -XX:+UseG1GC", "JVM options for the peer, space-separated")
	examples := fs.Int("examples", 5, "differing rows to show per group")
	workDir := fs.String("workdir", "", "scratch directory for the peer's log and state (default a new directory under $TMPDIR)")
	timeout := fs.Duration("run-timeout", 10*time.Minute, "give up on the peer if it has not answered every input after this long")
	stall := fs.Duration("stall-timeout", 90*time.Second, "fail if the outputs have not grown for this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bl := splitList(*brokers)
	if err := checkLoopback(bl); err != nil {
		return err
	}
	if *events < 1 || *events > 2_000_000 || *entities < 2 || *groups < 1 || *groups > MaxBenchGroups {
		return fmt.Errorf("--events 1..2M, --entities > 1, --groups 1..%d", MaxBenchGroups)
	}
	if _, err := os.Stat(*jar); err != nil {
		return err
	}
	var err error
	if *workDir == "" {
		if *workDir, err = os.MkdirTemp("", "velocity-bench-groups-check-"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(*workDir, 0o755); err != nil {
		return err
	}
	adm, cl, err := newAdmin(bl)
	if err != nil {
		return err
	}
	defer cl.Close()
	r := &runner{
		brokers: bl, adm: adm, workDir: *workDir, runTimeout: *timeout, stallTimeout: *stall,
		tag: strconv.FormatInt(time.Now().Unix()%1_000_000, 36),
		env: procEnv{Brokers: strings.Join(bl, ","), Jar: *jar, Java: *java, JavaOpts: strings.Fields(*javaOpts)},
	}
	w := DefaultWorkload(*entities, *events)
	w.Format = FormatPayments
	input, output, dlq, group, dir, err := r.names("groups-check")
	if err != nil {
		return err
	}
	topics := GroupTopics(output, *groups)
	if err := createTopics(ctx, adm, partitions, nil, input); err != nil {
		return err
	}
	if err := createTopics(ctx, adm, partitions, outputConfigs, append(topics, dlq)...); err != nil {
		return err
	}
	defer r.cleanup(group, dir, append(topics, input, dlq)...)
	if _, err := produceAll(ctx, bl, input, w); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	inputs := make(map[srcKey][]byte, w.Events)
	if err := readFromStart(ctx, bl, false, []string{input}, w.Events, 2*time.Minute, func(rec *kgo.Record) {
		inputs[srcKey{rec.Partition, rec.Offset}] = rec.Value
	}); err != nil {
		return err
	}
	p := ProcSpec{Kind: "kstreams", EOS: *eos, Groups: *groups, Name: "kstreams:groups=" + strconv.Itoa(*groups)}
	cmd, err := r.env.command(p, input, output, dlq, group, dir)
	if err != nil {
		return err
	}
	c, err := startChild(cmd)
	if err != nil {
		return err
	}
	count := func() (int64, error) { return endOffsetSum(ctx, adm, topics...) }
	werr := r.waitCount(ctx, c, count, int64(*groups*w.Events), r.runTimeout)
	if *eos {
		// Transaction markers take offsets: read the committed rows before stopping.
		time.Sleep(time.Second)
	}
	c.stop(60 * time.Second)
	if werr != nil {
		return fmt.Errorf("%w (log %s/processor.log)", werr, dir)
	}
	failed := 0
	for g, topic := range topics {
		spec, err := GroupSpec(benchGroups[g])
		if err != nil {
			return err
		}
		rows, err := readGroupRows(ctx, bl, topic, spec, w.Events, 3*time.Minute)
		if err != nil {
			return err
		}
		res, err := checkPeerRows(benchGroups[g], inputs, rows, *examples)
		if err != nil {
			return err
		}
		fmt.Printf("group %s: %d rows, %d compared: %d identical but for late, %d differing after the key had an event ours refuses as expired (%d such events: applied by the peer behind the key's newest by more than the shortest window), %d differing otherwise; %d undecodable, %d duplicates (at-least-once reprocessing)\n",
			benchGroups[g].Name, len(rows), res.Compared, res.Identical, res.AfterExpired, res.Refused, len(res.Differing), res.Bad, res.Duplicates)
		for _, ex := range res.Examples {
			fmt.Println("  " + ex)
		}
		if len(res.Differing) > 0 || res.Bad > 0 {
			failed++
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d group(s) differ", failed)
	}
	return nil
}

// readGroupRows reads topic's rows (spec's record) until they name want distinct
// inputs, and returns each partition's rows in offset order, partitions in
// increasing order.
func readGroupRows(ctx context.Context, brokers []string, topic string, spec *feature.Spec, want int, timeout time.Duration) ([][]byte, error) {
	byPart := map[int32][][]byte{}
	seen := newOffsetSet()
	var head feature.Head
	row := feature.NewRow(spec)
	err := readUntil(ctx, brokers, true, []string{topic}, timeout, func(rec *kgo.Record) bool {
		byPart[rec.Partition] = append(byPart[rec.Partition], rec.Value)
		if feature.ParseRow(rec.Value, spec, &head, row) == nil {
			seen.Add(head.SourcePartition, head.SourceOffset)
		}
		return seen.count >= want
	}, func() string { return fmt.Sprintf("rows for %d of %d inputs", seen.count, want) })
	var parts []int32
	for p := range byPart {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	var out [][]byte
	for _, p := range parts {
		out = append(out, byPart[p]...)
	}
	return out, err
}

// peerCheck is what checkPeerRows found.
type peerCheck struct {
	Compared, Identical int
	Differing           []string // per differing row: which fields
	Examples            []string
	// Refused are rows whose input our engine refuses as expired: in the peer's order
	// the event is behind the key's newest by more than the group's shortest window.
	// Ours never applies such an order (the second stage releases each group's events
	// in event-time order, docs/repartition.md); the peer counts the event in the
	// windows that still hold it. From then on the key's features differ by design:
	// its later differing rows are AfterExpired, not Differing.
	Refused      int
	AfterExpired int
	Bad          int // rows that do not decode as the group's record or name no input
	// Duplicates are rows for an input that had a row already (the peer reprocessed
	// it after a task moved, at-least-once); they are not replayed, so the rows after
	// one for the same key may differ.
	Duplicates int
}

// checkPeerRows replays rows (one group's, in the order they were applied per key)
// through a feature.State of g's spec, feeding each row's input (inputs by source
// partition and offset, decoded with g's own mapping of payment_event.avsc), and
// compares every field of each row with ours but `late`.
func checkPeerRows(g benchGroup, inputs map[srcKey][]byte, rows [][]byte, examples int) (peerCheck, error) {
	var res peerCheck
	spec, err := GroupSpec(g)
	if err != nil {
		return res, err
	}
	d, err := definition.Parse("bench-"+g.Name+".yaml", []byte(inputYAML(g.Key)+g.featuresYAML("")))
	if err != nil {
		return res, err
	}
	comp, err := definition.Compile(d, paymentEventSchema, codec.Limits{})
	if err != nil {
		return res, err
	}
	dec := comp.Decoder()
	st, err := feature.NewState(*spec, window.Options{})
	if err != nil {
		return res, err
	}
	var head feature.Head
	peer, ref := feature.NewRow(spec), feature.NewRow(spec)
	var tx codec.Transaction
	cols := spec.Columns()
	seen := map[srcKey]bool{}
	expired := map[string]bool{} // keys with a Refused row so far
	for _, v := range rows {
		if err := feature.ParseRow(v, spec, &head, peer); err != nil {
			res.Bad++
			continue
		}
		if k := (srcKey{head.SourcePartition, head.SourceOffset}); seen[k] {
			res.Duplicates++
			continue
		} else {
			seen[k] = true
		}
		in, ok := inputs[srcKey{head.SourcePartition, head.SourceOffset}]
		if !ok {
			res.Bad++
			continue
		}
		if rej := dec.Decode(in, 0, false, &tx); rej != nil {
			res.Bad++
			continue
		}
		gap, hasPrev, err := st.Apply(tx.EntityID, tx.EventTime, tx.AmountMinor, tx.Ext, ref)
		if err != nil {
			res.Refused++
			expired[tx.EntityID] = true
			continue
		}
		res.Compared++
		var diff []string
		if head.EntityID != tx.EntityID {
			diff = append(diff, fmt.Sprintf("entity_id %q≠%q", head.EntityID, tx.EntityID))
		}
		if head.EventID != tx.EventID || head.EventTime != tx.EventTime {
			diff = append(diff, "event_id/event_time")
		}
		if head.HasPrevious != hasPrev || (hasPrev && head.MsSincePrevious != gap) {
			diff = append(diff, fmt.Sprintf("ms_since_previous %v/%d≠%v/%d", head.HasPrevious, head.MsSincePrevious, hasPrev, gap))
		}
		vi := 0
		for _, c := range cols {
			if c.Kind == feature.KindBoolean {
				continue
			}
			if peer.Values[vi] != ref.Values[vi] || peer.Null[vi] != ref.Null[vi] {
				diff = append(diff, fmt.Sprintf("%s %d≠%d", c.Name, peer.Values[vi], ref.Values[vi]))
			}
			vi++
		}
		if !slices.Equal(peer.Exact, ref.Exact) {
			diff = append(diff, fmt.Sprintf("exact %v≠%v", peer.Exact, ref.Exact))
		}
		if len(diff) == 0 {
			res.Identical++
			continue
		}
		if expired[tx.EntityID] {
			res.AfterExpired++
			continue
		}
		res.Differing = append(res.Differing, strings.Join(diff, ", "))
		if len(res.Examples) < examples {
			res.Examples = append(res.Examples, fmt.Sprintf("p%d@%d %s t=%d: %s (peer≠ours)", head.SourcePartition, head.SourceOffset, tx.EntityID, tx.EventTime, strings.Join(diff, ", ")))
		}
	}
	return res, nil
}
