package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/velocity-consumer/velocity-consumer/internal/oracle"
	"github.com/velocity-consumer/velocity-consumer/pkg/codec"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// The pure part of `velocity-bench equal`: compare two processors' outputs record by
// record, keyed by the input they answer, and explain every difference with an
// independent model of each side's semantics. No broker here; equal.go does the I/O.

// srcKey is an input record's position; both processors stamp it into every output.
type srcKey struct {
	P int32
	O int64
}

func (k srcKey) String() string { return fmt.Sprintf("p%d@%d", k.P, k.O) }

// inEvent is one decoded input record.
type inEvent struct {
	Key        srcKey
	ID, Entity string
	T, Amount  int64
}

// outRec is what a processor emitted for one input: features or a dead letter.
type outRec struct {
	Dead   bool
	Reason string
	F      codec.Features
}

// flavor selects the semantics the model computes.
type flavor uint8

const (
	// flavorOurs: velocity-consumer with --allowed-lateness 0 --late apply. With no
	// lateness every event is released on arrival, so events apply in offset order;
	// an event behind the partition's newest event time is late: it is applied with
	// late=true if its bucket is still retained in every window of its entity, else
	// dead-lettered (reason late) and not counted.
	flavorOurs flavor = iota
	// flavorPeer: bench/kstreams. Offset order too; late=true when behind the
	// entity's newest event time; an event whose bucket left some window is still
	// counted in the windows that retain it (0/0/0/0 in the others) and never
	// dead-lettered.
	flavorPeer
)

// modelRec is the model's answer for one input, with the facts that explain it.
type modelRec struct {
	outRec
	BehindPartition bool // event time < newest event time so far on its partition
	BehindEntity    bool // event time < its entity's newest so far
	Expired         bool // its bucket had left some window of its entity
	AfterExpired    bool // its entity had an expired event before it (states may diverge)
	// LiteralDiffers: a late event whose windows, read literally by the window rule ("counted
	// events in buckets k−N+1 … k that come at or before e in (event_time, offset)
	// order"), differ from the whole-bucket read both processors do. Informational.
	LiteralDiffers bool
}

type applied struct{ t, a, o int64 }

type entState struct {
	ev            []applied
	newest, prevT int64
	expiredBefore bool
}

// modelPartition computes fl's output for every event of one partition, given in
// offset order. Entities are never evicted (the workload spans far less than the
// entity TTL, and every event stays inside the 24 h window).
func modelPartition(fl flavor, specs []window.Spec, topic string, evs []inEvent) map[srcKey]modelRec {
	out := make(map[srcKey]modelRec, len(evs))
	st := map[string]*entState{}
	var pmax int64
	hasPmax := false
	for _, e := range evs {
		var m modelRec
		m.BehindPartition = hasPmax && e.T < pmax
		if !hasPmax || e.T > pmax {
			pmax, hasPmax = e.T, true
		}
		s := st[e.Entity]
		top := e.T
		if s != nil {
			m.BehindEntity = e.T < s.newest
			m.AfterExpired = s.expiredBefore
			top = max(s.newest, e.T)
		}
		expired := make([]bool, len(specs))
		for i, sp := range specs {
			lo := oracle.FloorDiv(top, sp.BucketMs) - int64(sp.Buckets) + 1
			if oracle.FloorDiv(e.T, sp.BucketMs) < lo {
				expired[i], m.Expired = true, true
			}
		}
		if fl == flavorOurs && m.Expired {
			m.Dead, m.Reason = true, string(codec.ReasonLate)
			out[e.Key] = m
			continue
		}
		f := codec.Features{
			EventID: e.ID, EntityID: e.Entity, EventTime: e.T, SourceTopic: topic,
			SourcePartition: e.Key.P, SourceOffset: e.Key.O,
		}
		if fl == flavorOurs {
			f.Late = m.BehindPartition
		} else {
			f.Late = m.BehindEntity
		}
		var prev []applied
		if s != nil {
			prev = s.ev
			f.MsSincePrevious, f.HasPrevious = e.T-s.prevT, true
		}
		for i, sp := range specs {
			w := codec.WindowAgg{Name: sp.Name, WindowMs: sp.WindowMs, BucketMs: sp.BucketMs}
			k := oracle.FloorDiv(e.T, sp.BucketMs)
			if !expired[i] {
				lo := oracle.FloorDiv(top, sp.BucketMs) - int64(sp.Buckets) + 1
				w = aggregate(w, prev, e, func(o applied) bool {
					ko := oracle.FloorDiv(o.t, sp.BucketMs)
					return ko >= lo && ko <= k
				})
			}
			f.Windows = append(f.Windows, w)
			if m.BehindPartition && !expired[i] {
				lit := aggregate(codec.WindowAgg{Name: sp.Name, WindowMs: sp.WindowMs, BucketMs: sp.BucketMs}, prev, e, func(o applied) bool {
					ko := oracle.FloorDiv(o.t, sp.BucketMs)
					return ko >= k-int64(sp.Buckets)+1 && ko <= k && (o.t < e.T || o.t == e.T && o.o < e.Key.O)
				})
				if lit != w {
					m.LiteralDiffers = true
				}
			}
		}
		m.F = f
		out[e.Key] = m
		if s == nil {
			s = &entState{}
			st[e.Entity] = s
		}
		s.ev = append(s.ev, applied{e.T, e.Amount, e.Key.O})
		s.prevT, s.newest = e.T, top
		s.expiredBefore = s.expiredBefore || m.Expired
	}
	return out
}

// aggregate counts e and the events of prev that in selects into w.
func aggregate(w codec.WindowAgg, prev []applied, e inEvent, in func(applied) bool) codec.WindowAgg {
	w.Count, w.SumMinor, w.MinMinor, w.MaxMinor = 1, e.Amount, e.Amount, e.Amount
	for _, o := range prev {
		if !in(o) {
			continue
		}
		w.Count++
		w.SumMinor += o.a
		w.MinMinor = min(w.MinMinor, o.a)
		w.MaxMinor = max(w.MaxMinor, o.a)
	}
	return w
}

// model runs modelPartition over every partition of inputs.
func model(fl flavor, specs []window.Spec, topic string, inputs []inEvent) map[srcKey]modelRec {
	byP := map[int32][]inEvent{}
	for _, e := range inputs {
		byP[e.Key.P] = append(byP[e.Key.P], e)
	}
	out := make(map[srcKey]modelRec, len(inputs))
	for _, evs := range byP {
		slices.SortFunc(evs, func(a, b inEvent) int { return cmp.Compare(a.Key.O, b.Key.O) })
		for k, v := range modelPartition(fl, specs, topic, evs) {
			out[k] = v
		}
	}
	return out
}

// diffFields names the fields in which two outputs differ: "dead" when one is a dead
// letter and the other not (or the reasons differ), else the features fields,
// windows as windows[NAME].count|sum|min|max|shape.
func diffFields(a, b outRec) []string {
	if a.Dead || b.Dead {
		if a.Dead != b.Dead || a.Reason != b.Reason {
			return []string{"dead"}
		}
		return nil
	}
	x, y := &a.F, &b.F
	var d []string
	add := func(differ bool, name string) {
		if differ {
			d = append(d, name)
		}
	}
	add(x.EventID != y.EventID, "event_id")
	add(x.EntityID != y.EntityID, "entity_id")
	add(x.EventTime != y.EventTime, "event_time")
	if len(x.Windows) != len(y.Windows) {
		d = append(d, "windows.shape")
	} else {
		for i := range x.Windows {
			u, v := x.Windows[i], y.Windows[i]
			n := "windows[" + u.Name + "]"
			if u.Name != v.Name || u.WindowMs != v.WindowMs || u.BucketMs != v.BucketMs {
				d = append(d, n+".shape")
				continue
			}
			add(u.Count != v.Count, n+".count")
			add(u.SumMinor != v.SumMinor, n+".sum")
			add(u.MinMinor != v.MinMinor, n+".min")
			add(u.MaxMinor != v.MaxMinor, n+".max")
		}
	}
	add(x.HasPrevious != y.HasPrevious || x.HasPrevious && x.MsSincePrevious != y.MsSincePrevious, "ms_since_previous")
	add(x.Late != y.Late, "late")
	add(x.SourceTopic != y.SourceTopic, "source_topic")
	add(x.SourcePartition != y.SourcePartition || x.SourceOffset != y.SourceOffset, "source_position")
	return d
}

// Cause labels of the classification. Every difference gets exactly one.
const (
	causeLateFlag = "late flag: behind the partition's newest event time but not its entity's " +
		"(ours: late = event_time < partition watermark; Streams: < the entity's newest)"
	causeExpired = "out-of-order event whose bucket had left a window: ours dead-letters it " +
		"(late), Streams counts it in the windows that still hold its bucket"
	causeAfterExpired = "entity state diverged after such an expired event"
	causeOursOff      = "UNEXPLAINED: ours differs from the model of its semantics"
	causePeerOff      = "UNEXPLAINED: Streams differs from the model of its semantics"
	causeModel        = "UNEXPLAINED: both sides match their models, models differ for no known reason"
	causeMissing      = "missing output"
)

// classify explains why field differs between ours and peer for one input, given
// both sides' model answers.
func classify(field string, ours, peer outRec, mo, mp modelRec) string {
	oursOK := slices.Contains(diffFields(ours, mo.outRec), field) == false
	peerOK := slices.Contains(diffFields(peer, mp.outRec), field) == false
	switch {
	case !oursOK:
		return causeOursOff
	case !peerOK:
		return causePeerOff
	case mo.Expired:
		return causeExpired
	case mo.AfterExpired:
		return causeAfterExpired
	case field == "late" && mo.BehindPartition && !mp.BehindEntity:
		return causeLateFlag
	}
	return causeModel
}

// equalReport is the outcome of one comparison.
type equalReport struct {
	Inputs            int            `json:"inputs"`
	OursOutputs       int            `json:"ours_outputs"`
	PeerOutputs       int            `json:"peer_outputs"`
	OursDead          int            `json:"ours_dead_letters"`
	PeerDead          int            `json:"peer_dead_letters"`
	Compared          int            `json:"compared"` // inputs both answered
	Identical         int            `json:"identical"`
	Differing         int            `json:"differing"`
	ByField           map[string]int `json:"differing_by_field"`
	ByCause           map[string]int `json:"differences_by_cause"` // one per (input, field)
	RecordsByCause    map[string]int `json:"records_by_cause"`     // one per input: its causes joined by " + "
	OursVsModel       map[string]int `json:"ours_vs_model_by_field"`
	PeerVsModel       map[string]int `json:"peer_vs_model_by_field"`
	BehindPartition   int            `json:"behind_partition"` // inputs out of order on their partition
	BehindEntity      int            `json:"behind_entity"`    // … and behind their own entity's newest
	Expired           int            `json:"expired"`
	LiteralDiffers    int            `json:"late_literal_contract_differs"`
	Examples          []string       `json:"examples"`
	UnexplainedSample []string       `json:"unexplained_examples,omitempty"`
}

// compareOutputs compares ours and peer on every input and classifies the differences.
func compareOutputs(specs []window.Spec, topic string, inputs []inEvent, ours, peer map[srcKey]outRec, maxExamples int) equalReport {
	rep := equalReport{
		Inputs: len(inputs), OursOutputs: len(ours), PeerOutputs: len(peer),
		ByField: map[string]int{}, ByCause: map[string]int{}, RecordsByCause: map[string]int{},
		OursVsModel: map[string]int{}, PeerVsModel: map[string]int{},
	}
	for _, r := range ours {
		if r.Dead {
			rep.OursDead++
		}
	}
	for _, r := range peer {
		if r.Dead {
			rep.PeerDead++
		}
	}
	mo := model(flavorOurs, specs, topic, inputs)
	mp := model(flavorPeer, specs, topic, inputs)
	keys := make([]srcKey, 0, len(inputs))
	for _, e := range inputs {
		keys = append(keys, e.Key)
	}
	slices.SortFunc(keys, func(a, b srcKey) int {
		return cmp.Or(cmp.Compare(a.P, b.P), cmp.Compare(a.O, b.O))
	})
	for _, k := range keys {
		m1, m2 := mo[k], mp[k]
		if m1.BehindPartition {
			rep.BehindPartition++
		}
		if m1.BehindEntity {
			rep.BehindEntity++
		}
		if m1.Expired {
			rep.Expired++
		}
		if m1.LiteralDiffers {
			rep.LiteralDiffers++
		}
		o, okO := ours[k]
		p, okP := peer[k]
		if okO {
			for _, f := range diffFields(o, m1.outRec) {
				rep.OursVsModel[f]++
			}
		}
		if okP {
			for _, f := range diffFields(p, m2.outRec) {
				rep.PeerVsModel[f]++
			}
		}
		if !okO || !okP {
			side := "ours"
			if okO {
				side = "Streams"
			}
			rep.Differing++
			rep.ByField["missing"]++
			rep.ByCause[causeMissing]++
			rep.RecordsByCause[causeMissing]++
			rep.addExample(maxExamples, fmt.Sprintf("%s: no output from %s", k, side), false)
			continue
		}
		rep.Compared++
		fields := diffFields(o, p)
		if len(fields) == 0 {
			rep.Identical++
			continue
		}
		rep.Differing++
		var causes []string
		unexplained := false
		for _, f := range fields {
			rep.ByField[f]++
			c := classify(f, o, p, m1, m2)
			rep.ByCause[c]++
			if !slices.Contains(causes, c) {
				causes = append(causes, c)
			}
			unexplained = unexplained || strings.HasPrefix(c, "UNEXPLAINED")
		}
		slices.Sort(causes)
		rep.RecordsByCause[strings.Join(causes, " + ")]++
		rep.addExample(maxExamples, describeDiff(k, fields, o, p, m1), unexplained)
	}
	return rep
}

func (r *equalReport) addExample(n int, s string, unexplained bool) {
	if len(r.Examples) < n {
		r.Examples = append(r.Examples, s)
	}
	if unexplained && len(r.UnexplainedSample) < n {
		r.UnexplainedSample = append(r.UnexplainedSample, s)
	}
}

func describeDiff(k srcKey, fields []string, o, p outRec, m modelRec) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s %s t=%d", k, o.F.EntityID, o.F.EventTime)
	if m.BehindPartition {
		sb.WriteString(" behind-partition")
	}
	if m.BehindEntity {
		sb.WriteString(" behind-entity")
	}
	for _, f := range fields {
		fmt.Fprintf(&sb, "; %s ours=%s streams=%s", f, fieldValue(f, o), fieldValue(f, p))
	}
	return sb.String()
}

func fieldValue(field string, r outRec) string {
	if r.Dead {
		return "dead(" + r.Reason + ")"
	}
	f := &r.F
	switch field {
	case "late":
		return fmt.Sprint(f.Late)
	case "ms_since_previous":
		if !f.HasPrevious {
			return "null"
		}
		return fmt.Sprint(f.MsSincePrevious)
	case "event_id":
		return f.EventID
	case "entity_id":
		return f.EntityID
	case "event_time":
		return fmt.Sprint(f.EventTime)
	case "source_topic":
		return f.SourceTopic
	case "source_position":
		return fmt.Sprintf("p%d@%d", f.SourcePartition, f.SourceOffset)
	}
	if name, ok := strings.CutPrefix(field, "windows["); ok {
		name, part, _ := strings.Cut(name, "].")
		for _, w := range f.Windows {
			if w.Name != name {
				continue
			}
			switch part {
			case "count":
				return fmt.Sprint(w.Count)
			case "sum":
				return fmt.Sprint(w.SumMinor)
			case "min":
				return fmt.Sprint(w.MinMinor)
			case "max":
				return fmt.Sprint(w.MaxMinor)
			}
			return fmt.Sprintf("%d:%d", w.WindowMs, w.BucketMs)
		}
	}
	return "?"
}

// text renders the report for a human.
func (r equalReport) text() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "inputs %d; outputs: ours %d (%d dead letters), Streams %d (%d dead letters)\n",
		r.Inputs, r.OursOutputs, r.OursDead, r.PeerOutputs, r.PeerDead)
	fmt.Fprintf(&sb, "compared %d, identical %d, differing %d\n", r.Compared, r.Identical, r.Differing)
	fmt.Fprintf(&sb, "out of order: %d behind their partition's newest event, %d behind their entity's newest, %d expired from a window\n",
		r.BehindPartition, r.BehindEntity, r.Expired)
	writeCounts(&sb, "differing records by field", r.ByField)
	writeCounts(&sb, "differences by cause (one per record and field)", r.ByCause)
	writeCounts(&sb, "differing records by cause", r.RecordsByCause)
	writeCounts(&sb, "ours against the model of its semantics, by field", r.OursVsModel)
	writeCounts(&sb, "Streams against the model of its semantics, by field", r.PeerVsModel)
	fmt.Fprintf(&sb, "late events whose whole-bucket windows differ from the window rule's literal reading: %d\n", r.LiteralDiffers)
	if len(r.Examples) > 0 {
		sb.WriteString("first differing records:\n")
		for _, e := range r.Examples {
			sb.WriteString("  " + e + "\n")
		}
	}
	if len(r.UnexplainedSample) > 0 {
		sb.WriteString("first UNEXPLAINED differences:\n")
		for _, e := range r.UnexplainedSample {
			sb.WriteString("  " + e + "\n")
		}
	}
	return sb.String()
}

func writeCounts(sb *strings.Builder, title string, m map[string]int) {
	fmt.Fprintf(sb, "%s:", title)
	if len(m) == 0 {
		sb.WriteString(" none\n")
		return
	}
	sb.WriteString("\n")
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	for _, k := range keys {
		fmt.Fprintf(sb, "  %8d  %s\n", m[k], k)
	}
}
