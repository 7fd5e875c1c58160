package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/feature"
)

// runGroupsThroughput is runThroughput for a groups=N processor: the input (the
// payments workload) already holds want records; the run ends when every group has
// answered every input, a feature row in the group's topic or, for ours, one dead
// letter (a record rejected at its input partition yields nothing for any group).
// CPU per event and events/s are per INPUT event, so that 1, 2 and 3 groups compare
// by what a transaction costs.
func (r *runner) runGroupsThroughput(ctx context.Context, p ProcSpec, input string, want, entities int) Result {
	res := Result{Mode: "throughput", Processor: p.Name, Entities: entities, Events: want, Groups: p.Groups}
	specs := make([]*feature.Spec, p.Groups)
	for g := range specs {
		var err error
		if specs[g], err = GroupSpec(benchGroups[g]); err != nil {
			res.Err = err.Error()
			return res
		}
	}
	_, output, dlq, group, dir, err := r.names(safeName(p.Name))
	if err != nil {
		res.Err = err.Error()
		return res
	}
	topics := GroupTopics(output, p.Groups)
	if err := createTopics(ctx, r.adm, partitions, outputConfigs, append(topics, dlq)...); err != nil {
		res.Err = err.Error()
		return res
	}
	defer r.cleanup(group, dir, append(topics, dlq)...)

	cmd, err := r.env.command(p, input, output, dlq, group, dir)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	res.ProcessLogPath = filepath.Join(dir, "processor.log")
	start := time.Now()
	c, err := startChild(cmd)
	if err != nil {
		res.Err = fmt.Sprintf("start %s: %v", p.Name, err)
		return res
	}
	stopped := false
	var exit procSample
	stop := func() {
		if !stopped {
			stopped = true
			exit = c.stop(60 * time.Second)
		}
	}
	defer stop()
	// Every input is answered once per group: a row in each group's topic, or a dead
	// letter, which stands for every group when the input partition decided it and
	// for its own group only when a re-keyed group's second stage did (header
	// velocity.group). So the wait reads the dead letters (a few per cent of the
	// records) to tell the two apart.
	n := int64(p.Groups)
	dead, err := newDeadLetterCounter(r.brokers, dlq)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer dead.close()
	count := func() (int64, error) {
		rows, err := endOffsetSum(ctx, r.adm, topics...)
		if err != nil {
			return 0, err
		}
		all, one := dead.poll(ctx)
		return rows + n*all + one, nil
	}
	if err := r.waitCount(ctx, c, count, n*int64(want), r.runTimeout); err != nil {
		res.Err = err.Error()
		return res
	}
	if s, err := sampleProc(c.cmd.Process.Pid); err == nil {
		res.CPUSec = s.CPU.Seconds()
		res.PeakRSSMiB = float64(s.PeakRSSB) / (1 << 20)
		res.CPUSecPerMEvt = res.CPUSec / float64(want) * 1e6
	}
	if !p.EOS {
		stop() // see measure: without transactions every counted offset is a record
	}
	sr, err := scanGroups(ctx, r.brokers, topics, dlq, specs, want, 3*time.Minute)
	stop()
	res.ExitCPUSec = exit.CPU.Seconds()
	res.ExitMaxRSSMiB = float64(exit.PeakRSSB) / (1 << 20)
	res.GroupRows, res.GroupKeys, res.DeadLetterReasons = sr.Rows, sr.Keys, sr.Reasons
	res.DeadLetters, res.Dups, res.BadValues = sr.DeadLetters, sr.Dups, sr.BadValues
	res.Unique = sr.Unique
	for _, x := range sr.Rows {
		res.Features += x
	}
	if err != nil {
		res.Err = err.Error()
		return res
	}
	if span := sr.LastAppend.Sub(sr.FirstAppend).Seconds(); span > 0 {
		res.EventsPerSec = float64(want) / span
	}
	res.WallSec = sr.LastAppend.Sub(start).Seconds()
	res.StartupSec = sr.FirstAppend.Sub(start).Seconds()
	return res
}

// groupsScan is what a groups run's outputs say once read back.
type groupsScan struct {
	Rows        []int // feature rows per group
	Keys        []int // distinct entity_id (the group's key) per group
	DeadLetters int
	// Reasons counts the dead letters by "<group>:<reason>", <group> "input" for
	// those the input partition decided (they answer for every group).
	Reasons map[string]int
	// Unique is the number of inputs every group answered (a row in each, or a
	// dead letter); Dups counts rows or dead letters for an input that a group had
	// answered already.
	Unique, Dups int
	BadValues    int // rows that are not the group's flat record (feature.ParseRow)
	FirstAppend  time.Time
	LastAppend   time.Time
}

// groupsTally accounts the output records of a groups run: topics[g] holds group g's
// rows (decoded with specs[g]), dlq the dead letters.
type groupsTally struct {
	topicGroup map[string]int
	dlq        string
	specs      []*feature.Spec
	rows       []*feature.Row
	head       feature.Head
	seen       []*offsetSet
	keys       []map[string]struct{}
	dead       []int // dead letters that answer for group g
	res        groupsScan
}

func newGroupsTally(topics []string, dlq string, specs []*feature.Spec) *groupsTally {
	t := &groupsTally{topicGroup: map[string]int{}, dlq: dlq, specs: specs, dead: make([]int, len(topics))}
	t.res.Rows = make([]int, len(topics))
	t.res.Reasons = map[string]int{}
	for g, name := range topics {
		t.topicGroup[name] = g
		t.rows = append(t.rows, feature.NewRow(specs[g]))
		t.seen = append(t.seen, newOffsetSet())
		t.keys = append(t.keys, map[string]struct{}{})
	}
	return t
}

func (t *groupsTally) add(r *kgo.Record) {
	ts := r.Timestamp
	if t.res.FirstAppend.IsZero() || ts.Before(t.res.FirstAppend) {
		t.res.FirstAppend = ts
	}
	if ts.After(t.res.LastAppend) {
		t.res.LastAppend = ts
	}
	if r.Topic == t.dlq {
		t.res.DeadLetters++
		p, off := dlqSource(r)
		group, reason := deadLetterGroup(r)
		t.res.Reasons[group+":"+reason]++
		for g, s := range t.seen {
			if group == inputDecided || group == benchGroups[g].Name {
				s.Add(p, off)
				t.dead[g]++
			}
		}
		return
	}
	g, ok := t.topicGroup[r.Topic]
	if !ok {
		return
	}
	t.res.Rows[g]++
	if err := feature.ParseRow(r.Value, t.specs[g], &t.head, t.rows[g]); err != nil {
		t.res.BadValues++
		return
	}
	t.seen[g].Add(t.head.SourcePartition, t.head.SourceOffset)
	t.keys[g][t.head.EntityID] = struct{}{}
}

// answered is the number of inputs the group that has answered fewest has answered.
func (t *groupsTally) answered() int {
	least := -1
	for g := range t.seen {
		if n := t.res.Rows[g] + t.dead[g]; least < 0 || n < least {
			least = n
		}
	}
	return least
}

func (t *groupsTally) result() groupsScan {
	res := t.res
	res.Keys = make([]int, len(t.keys))
	res.Unique = -1
	for g := range t.seen {
		res.Keys[g] = len(t.keys[g])
		res.Dups += t.seen[g].dups
		if res.Unique < 0 || t.seen[g].count < res.Unique {
			res.Unique = t.seen[g].count
		}
	}
	return res
}

// scanGroups reads every group's topic and the dead letters from the start
// (read_committed) until each group has answered want inputs, or timeout passes.
func scanGroups(ctx context.Context, brokers []string, topics []string, dlq string, specs []*feature.Spec, want int, timeout time.Duration) (groupsScan, error) {
	t := newGroupsTally(topics, dlq, specs)
	err := readUntil(ctx, brokers, true, append(append([]string{}, topics...), dlq), timeout, func(r *kgo.Record) bool {
		t.add(r)
		return t.answered() >= want
	}, func() string {
		return fmt.Sprintf("rows per group %v, %d dead letters, want %d inputs answered", t.res.Rows, t.res.DeadLetters, want)
	})
	return t.result(), err
}

// headerGroup is the dead-letter header that names the re-keyed group whose second
// stage decided it (pkg/sink's HeaderGroup); a dead letter without it was decided at
// the input partition.
const headerGroup = "velocity.group"

// inputDecided is deadLetterGroup's group for a dead letter of the input partition.
const inputDecided = "input"

// deadLetterGroup is the group a dead letter answers for (inputDecided: all) and its
// reason.
func deadLetterGroup(r *kgo.Record) (group, reason string) {
	group = inputDecided
	for _, h := range r.Headers {
		switch h.Key {
		case headerGroup:
			group = string(h.Value)
		case codec.HeaderReason:
			reason = string(h.Value)
		}
	}
	return group, reason
}

// deadLetterCounter reads a run's dead letters as they come, to count those that
// answer for every group apart from those that answer for one.
type deadLetterCounter struct {
	cl       *kgo.Client
	all, one int64
}

func newDeadLetterCounter(brokers []string, dlq string) (*deadLetterCounter, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(dlq),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(10*time.Millisecond))
	if err != nil {
		return nil, err
	}
	return &deadLetterCounter{cl: cl}, nil
}

// poll reads what has arrived (waiting at most a few milliseconds) and returns the
// counts so far.
func (d *deadLetterCounter) poll(ctx context.Context) (all, one int64) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Millisecond)
	defer cancel()
	d.cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
		if g, _ := deadLetterGroup(r); g == inputDecided {
			d.all++
		} else {
			d.one++
		}
	})
	return d.all, d.one
}

func (d *deadLetterCounter) close() { d.cl.Close() }
