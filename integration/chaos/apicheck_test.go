//go:build integration

package chaos

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/velocity-consumer/velocity-consumer/pkg/definition"
	"github.com/velocity-consumer/velocity-consumer/pkg/window"
)

// What the query API's answers are judged by: an independent computation of
// every partition's state from the input, for any input offset and any number of
// events still pending. The service's outputs decide one thing only, through the
// replay: which input offsets were accepted (a features record, not a dead
// letter), which is dedupe's and validation's business. Amounts, event times,
// entities and currencies are the generator's own (genTx), never an output's.

// sweepEveryMs is how much watermark (event time) passes between two idle-entity
// sweeps of a partition (docs/contract.md, "Entities": every 60 s of event time).
// A partition sweeps at its first accepted event and then whenever its watermark
// is sweepEveryMs past the last sweep; the last sweep's watermark is the lower
// end of at_range and, when later than the newest counted event, the default
// as_of (docs/api.md).
const sweepEveryMs = 60_000

// maxTime bounds as-of times, as the API's at_range does (±2^62 ms).
const maxTime = 1 << 62

// accEvent is one accepted input record of a partition, in offset order.
type accEvent struct {
	off     int64
	tx      genTx
	prefMax int64 // the largest event time accepted at or before it: maxSeen after it
	sweep   int64 // the partition's last sweep after it
	late    bool  // behind the watermark: counted at once, under --late=apply (late_test.go)
	rel     int64 // the input offset at which replay counts it (replayOrder)
}

// partModel is one input partition's accepted events.
type partModel struct {
	acc      []accEvent
	byEntity map[string][]int // indices into acc, by the transaction's entity_id
}

// apiModel is the input as the answers are judged by it.
type apiModel struct {
	parts [partitions]partModel
	ends  map[int32]int64
	// specs are the windows of the velocity endpoint: the definition's, or the
	// default contract's.
	specs []window.Spec
	def   *definition.Definition // nil without --features
	label string                 // "<version>@<hash>": what "definition" says
	late  string                 // the --late policy: "dlq" or "apply"
}

// newAPIModel builds the model of the input below ends: an offset is accepted
// when replay's one output for it is a features record; its transaction is the
// generator's (by the id of its chaos.gen header, gen), which must exist and
// have the features record's key as its entity. An error says the model cannot
// be built, and no answer can be judged.
func newAPIModel(ends map[int32]int64, replay map[srcKey][]output, gen map[srcKey]string, txs map[string]genTx, specs []window.Spec, def *definition.Definition, late string) (*apiModel, error) {
	m := &apiModel{ends: ends, specs: specs, def: def, late: late}
	if def != nil {
		m.label = def.Version + "@" + def.Hash()
		if err := checkModelled(def); err != nil {
			return nil, err
		}
	}
	for p := range int32(partitions) {
		pm := &m.parts[p]
		pm.byEntity = map[string][]int{}
		maxSeen, lastSweep := int64(math.MinInt64), int64(0)
		for off := int64(0); off < ends[p]; off++ {
			k := srcKey{p, off}
			rs := replay[k]
			if len(rs) != 1 || rs[0].dead {
				continue
			}
			tx, ok := txs[genID(gen[k])]
			if !ok {
				return nil, fmt.Errorf("input %d/%d (%q) has a features record in the replay but the generator made no transaction for it", p, off, gen[k])
			}
			if string(rs[0].key) != tx.entity {
				return nil, fmt.Errorf("input %d/%d (%q): the replay's features record is keyed %q, the generator's transaction is of %q", p, off, gen[k], rs[0].key, tx.entity)
			}
			maxSeen = max(maxSeen, tx.time)
			if wm := maxSeen - allowedLateness.Milliseconds(); wm-lastSweep >= sweepEveryMs {
				lastSweep = wm
			}
			pm.byEntity[tx.entity] = append(pm.byEntity[tx.entity], len(pm.acc))
			pm.acc = append(pm.acc, accEvent{off: off, tx: tx, prefMax: maxSeen, sweep: lastSweep})
		}
		evs := make([]orderEvent, len(pm.acc))
		for i, e := range pm.acc {
			evs[i] = orderEvent{e.off, e.tx.time}
		}
		late, _, rel := replayOrder(evs)
		for i := range pm.acc {
			pm.acc[i].late, pm.acc[i].rel = late[i], rel[i]
		}
	}
	return m, nil
}

// checkModelled refuses a definition the model cannot compute: filters on
// fields other than the transaction's, comparisons it does not know, distinct
// counts of other fields.
func checkModelled(def *definition.Definition) error {
	for _, f := range def.Features {
		if f.Filter >= 0 {
			for _, pr := range def.Filters[f.Filter].Predicates {
				if _, err := txField(genTx{}, pr.Field); err != nil {
					return fmt.Errorf("%s: %w", f.Name, err)
				}
				switch pr.Op {
				case definition.OpEq, definition.OpNe, definition.OpIn, definition.OpNotIn, definition.OpLt, definition.OpLe, definition.OpGt, definition.OpGe:
				default:
					return fmt.Errorf("%s: the checker does not model the comparison %s", f.Name, pr.Op)
				}
			}
		}
		if f.Agg == definition.AggDistinctCount {
			if _, err := txField(genTx{}, f.Field); err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
		}
	}
	return nil
}

// txField is a transaction field as a definition names it: a string, or the
// amount as a decimal integer.
func txField(tx genTx, path string) (string, error) {
	switch path {
	case "event_id":
		return tx.eventID, nil
	case "entity_id":
		return tx.entity, nil
	case "currency":
		return tx.currency, nil
	case "amount_minor":
		return strconv.FormatInt(tx.amount, 10), nil
	case "event_time":
		return strconv.FormatInt(tx.time, 10), nil
	}
	return "", fmt.Errorf("the checker does not model the field %q", path)
}

// matches is a filter of the definition on a transaction: every predicate holds.
// Numbers (amount_minor, event_time) compare as integers, strings as strings.
func matches(def *definition.Definition, filter int, tx genTx) bool {
	if filter < 0 {
		return true
	}
	for _, pr := range def.Filters[filter].Predicates {
		v, _ := txField(tx, pr.Field)
		numeric := pr.Field == "amount_minor" || pr.Field == "event_time"
		cmp := func(lit string) int {
			if numeric {
				a, _ := strconv.ParseInt(v, 10, 64)
				b, _ := strconv.ParseInt(lit, 10, 64)
				return cmpInt(a, b)
			}
			return strings.Compare(v, lit)
		}
		in := slices.ContainsFunc(pr.Values, func(l definition.Literal) bool { return cmp(l.Text) == 0 })
		ok := false
		switch pr.Op {
		case definition.OpEq, definition.OpIn:
			ok = in
		case definition.OpNe, definition.OpNotIn:
			ok = !in
		case definition.OpLt:
			ok = cmp(pr.Values[0].Text) < 0
		case definition.OpLe:
			ok = cmp(pr.Values[0].Text) <= 0
		case definition.OpGt:
			ok = cmp(pr.Values[0].Text) > 0
		case definition.OpGe:
			ok = cmp(pr.Values[0].Text) >= 0
		}
		if !ok {
			return false
		}
	}
	return true
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// state is a partition's state as an answer at (last_offset, pending) must see
// it.
type state struct {
	accepted   int     // accepted events at offsets ≤ last_offset
	candidates []int   // those that may be pending: event time above the watermark, newest offset first
	pending    []int   // the pending ones (indices into acc)
	counted    []int   // the entity's counted events (indices into acc), in offset order
	countedOff []int64 // their input offsets
	asOf       int64   // the default as_of
	from, to   int64   // at_range
	wm         int64   // the watermark (maxSeen − lateness); valid when accepted > 0
	lastSweep  int64   // 0: none
	// fromUnknown: the last sweep is not known (a re-keyed group's outputs
	// disagree on how an event was counted), and at_range.from is not judged.
	fromUnknown bool
	newest      int64   // the newest counted event time; valid when hasNewest
	hasNewest   bool    // some event is counted
	entityEvs   []genTx // the entity's counted transactions, in offset order
}

// at computes partition p's state when it has processed every offset up to
// last and holds pending events in its reorder buffer, for entity.
//
// Which events are pending. An accepted event waits in the reorder buffer until
// the watermark (the largest accepted event time minus --allowed-lateness)
// reaches it, and leaves in (event time, offset) order (pkg/watermark: Ready
// after every accepted record releases every event at or below the watermark);
// an idle release (--idle-timeout, wall clock) releases everything pending at
// once, without moving the watermark. So after the records up to last, every
// accepted event with an event time at or below the watermark has been
// released, and those above it (the candidates) were accepted after the
// watermark last moved past them: what is still pending of them is what was
// accepted after the last idle release, a suffix of the candidates in offset
// order. An answer's pending = n therefore names exactly the last n candidates
// by offset (n more than there are candidates is a wrong answer). On the
// checker's input (per partition, accepted event times never decrease, see the
// generator) the candidates are the newest accepted events themselves, so these
// are "the last pending accepted events"; the rule above does not need it, and
// also holds for a record the producer's retry landed out of order.
func (m *apiModel) at(p int32, last int64, pending int, entity string) (state, error) {
	pm := &m.parts[p]
	s := state{from: -maxTime, to: maxTime}
	var largest int64
	for _, sp := range m.specs {
		largest = max(largest, sp.WindowMs)
	}
	s.accepted = sort.Search(len(pm.acc), func(i int) bool { return pm.acc[i].off > last })
	if pending < 0 {
		return s, fmt.Errorf("pending %d is negative", pending)
	}
	if s.accepted == 0 {
		// Nothing accepted: no watermark, no sweep, as_of 0 (pkg/pipeline AsOf).
		if pending != 0 {
			return s, fmt.Errorf("pending %d, but no event at or before offset %d is accepted", pending, last)
		}
		return s, nil
	}
	s.wm = pm.acc[s.accepted-1].prefMax - allowedLateness.Milliseconds()
	s.lastSweep = pm.acc[s.accepted-1].sweep
	j := s.accepted - 1
	for ; j >= 0 && pm.acc[j].prefMax > s.wm; j-- {
		if pm.acc[j].tx.time > s.wm {
			s.candidates = append(s.candidates, j)
		}
	}
	if pending > len(s.candidates) {
		return s, fmt.Errorf("pending %d, but only %d accepted events at or before offset %d are above the watermark %d", pending, len(s.candidates), last, s.wm)
	}
	s.pending = s.candidates[:pending]
	pendingSet := make(map[int]bool, len(s.pending))
	for _, i := range s.pending {
		pendingSet[i] = true
	}
	isPending := func(i int) bool { return i > j && pendingSet[i] }
	// Every event before the tail scanned above has an event time at or below
	// the watermark: it is counted.
	if j >= 0 {
		s.newest, s.hasNewest = pm.acc[j].prefMax, true
	}
	for i := j + 1; i < s.accepted; i++ {
		if !isPending(i) && (!s.hasNewest || pm.acc[i].tx.time > s.newest) {
			s.newest, s.hasNewest = pm.acc[i].tx.time, true
		}
	}
	// as_of: the newest counted event time, or the last sweep if later; before
	// any counted event, the last sweep (there is one: the first accepted event
	// sweeps).
	s.asOf = s.lastSweep
	if s.hasNewest {
		s.asOf = max(s.newest, s.lastSweep)
	}
	s.from = s.lastSweep
	s.to = min(s.asOf+largest, maxTime)
	for _, i := range pm.byEntity[entity] {
		if i >= s.accepted {
			break
		}
		if !isPending(i) {
			s.counted = append(s.counted, i)
			s.countedOff = append(s.countedOff, pm.acc[i].off)
			s.entityEvs = append(s.entityEvs, pm.acc[i].tx)
		}
	}
	return s, nil
}

// inWindow says whether an event at t is in window sp read at asOf: the
// window rule of docs/api.md, buckets floor(asOf/b)−N+1 … floor(asOf/b), whole
// buckets (an event later than asOf in asOf's bucket counts). Only reads at or
// after the bucket of the entity's newest counted event are answered (an
// earlier ?at= is at_not_retained), so no counted event is in a later bucket.
func inWindow(sp window.Spec, asOf, t int64) bool {
	n := sp.WindowMs / sp.BucketMs
	kt, ka := floorDiv(t, sp.BucketMs), floorDiv(asOf, sp.BucketMs)
	return kt >= ka-n+1 && kt <= ka
}

// windowAgg is the count, sum, min and max of the entity's counted events in a
// window (all zeros when empty, as the API writes an empty window).
type windowAgg struct{ count, sum, min, max int64 }

func aggregate(evs []genTx, keep func(genTx) bool) windowAgg {
	var a windowAgg
	for _, tx := range evs {
		if !keep(tx) {
			continue
		}
		if a.count == 0 {
			a.min, a.max = tx.amount, tx.amount
		}
		a.count++
		a.sum += tx.amount
		a.min, a.max = min(a.min, tx.amount), max(a.max, tx.amount)
	}
	return a
}

// ---- the answers ----

type rangeAnswer struct {
	From *int64 `json:"from"`
	To   *int64 `json:"to"`
}

// commonAnswer is what every lookup answer carries (docs/api.md).
type commonAnswer struct {
	Group      *string      `json:"group"`
	EntityID   *string      `json:"entity_id"`
	Known      *bool        `json:"known"`
	Partition  *int32       `json:"partition"`
	AsOf       *int64       `json:"as_of"`
	AsOfTime   *string      `json:"as_of_time"`
	LastOffset *int64       `json:"last_offset"`
	Pending    *int         `json:"pending"`
	AtRange    *rangeAnswer `json:"at_range"`
}

type windowAnswer struct {
	Window   string `json:"window"`
	WindowMs int64  `json:"window_ms"`
	BucketMs int64  `json:"bucket_ms"`
	Count    int64  `json:"count"`
	SumMinor int64  `json:"sum_minor"`
	MinMinor int64  `json:"min_minor"`
	MaxMinor int64  `json:"max_minor"`
}

type velocityAnswer struct {
	commonAnswer
	Windows []windowAnswer `json:"windows"`
}

type featuresAnswer struct {
	commonAnswer
	Definition *string                    `json:"definition"`
	Features   map[string]json.RawMessage `json:"features"`
	Exact      map[string]bool            `json:"exact"`
}

// answerVerdict is what judging one answer found: the broken invariant's kind
// (a key of the report) and what was expected, or nothing.
type answerVerdict struct {
	kind, detail string
}

// apiStats counts a group's requests by outcome, for the summary and the report.
type apiStats struct {
	sent, ok, unavailable, other, transport, skipped, floored int
	estimates                                                 int // distinct counts left unjudged: sampled estimates
	groups                                                    int // 200s of re-keyed groups, judged
	unjudged                                                  int // 200s of re-keyed groups with no model to judge them by
	txns                                                      int // transaction calls answered 200 (their entries are counted as answers too)
	ats, outOfRange                                           int // ?at= reads answered 200, and 422
	windowed                                                  int // velocity lookups with ?window= answered 200
	batches                                                   int // batches answered 200 (their results are counted as answers too)
	previews                                                  int // previews answered 200
	withoutDropped                                            int // answers that are the input's without events dead-lettered late after an idle release (judgeEnv.dropped)
}

func (s apiStats) String() string {
	return fmt.Sprintf("%d requests: %d answered 200 (%d of them re-keyed groups', and %d of those not judged; %d transaction calls and %d batches, whose entries count as answers; %d ?at= reads answered 200 and %d 422; %d ?window= lookups and %d previews answered 200), %d 503, %d other statuses, %d without an answer (refused, timed out, reset); %d 200s had a committed offset before them; %d sampled distinct estimates not judged; %d ticks skipped (too many in flight); %d answers the input's without events dead-lettered late after an idle release",
		s.sent, s.ok, s.groups+s.unjudged, s.unjudged, s.txns, s.batches, s.ats, s.outOfRange, s.windowed, s.previews, s.unavailable, s.other, s.transport, s.floored, s.estimates, s.skipped, s.withoutDropped)
}

// judgeEnv is what answers are judged by besides the input partitions' model:
// the committed offsets over the run of the group's input partitions (key "")
// and of each re-keyed group's second stages (key: the group's name), and the
// re-keyed groups' models (none: their answers are not judged).
type judgeEnv struct {
	floors map[string]*commitTimeline
	groups map[string]*groupModel
	// reordered are, by input partition, the entities an idle release made
	// count out of order (idle_test.go): their apply order is not the model's.
	reordered map[int32]map[string]bool
	// dropped are, by input partition, the offsets of the events this group's
	// outputs dead-lettered `late` where replay counted them: an idle release
	// moved the entity's newest event so far that the event's bucket had left
	// a window (contract.md, the idle rule, bounded), and its entity's windows
	// lack it for as long as they would hold its bucket. An instance that
	// counted it before a crash, and one that restored that state, has it.
	// withoutDropped judges a state without them (judge).
	dropped        map[int32]map[int64]bool
	withoutDropped bool
	rel            func(time.Time) string
}

// view is one state model as judge reads it: the input partitions' (velocity,
// features, the in-place group) or a re-keyed group's second stages'.
type view struct {
	ends map[int32]int64 // per partition, the end offset: every answer's last_offset is below it
	at   func(p int32, last int64, pending int, key string) (state, error)
	// behind says whether a state at last misses a record below floor, the
	// committed offset (the next to consume).
	behind   func(p int32, last, floor int64) bool
	describe func(s state, p int32, last int64) string
	specs    []window.Spec          // the windows a read's at must be retained in
	def      *definition.Definition // the features answers are computed by (nil: velocity only)
	label    string                 // what "definition" says
	group    string                 // what "group" says, on the group routes
}

func (m *apiModel) view() *view {
	v := &view{
		ends: m.ends, at: m.at, def: m.def, label: m.label, specs: m.specs,
		// Every input offset is a record (the input is not transactional).
		behind:   func(_ int32, last, floor int64) bool { return last+1 < floor },
		describe: func(s state, p int32, last int64) string { return s.describe(m, p, last) },
	}
	if m.def != nil {
		v.group = m.def.Group
	}
	return v
}

// judge checks one request's answer against the model and the group's
// committed offsets; the invariants are written above the code that checks
// them.
func (m *apiModel) judge(req *apiRequest, env *judgeEnv, st *apiStats) []answerVerdict {
	out := m.judgeOnce(req, env, st)
	if len(out) == 0 || len(env.dropped) == 0 || env.withoutDropped {
		return out
	}
	// A state may lack the events the group's outputs dead-lettered late
	// after an idle release (judgeEnv.dropped): the answer is judged again
	// by the model without them, and either is the input's.
	alt := *env
	alt.withoutDropped = true
	scratch := *st // counted once, by the first judgment
	if again := m.judgeOnce(req, &alt, &scratch); len(again) == 0 {
		st.withoutDropped++
		return nil
	}
	return out
}

// judgeOnce is judge by one model of the counted events.
func (m *apiModel) judgeOnce(req *apiRequest, env *judgeEnv, st *apiStats) []answerVerdict {
	if req.err != "" {
		// No answer: a killed instance refuses, a frozen one times out, a stopping
		// one resets. Nothing to judge.
		st.transport++
		return nil
	}
	switch {
	case req.status == 503:
		st.unavailable++
		// A 503 (restoring, moving, rebalancing, busy, owner unreachable) always
		// tells the caller when to retry (docs/api.md, Errors).
		if strings.TrimSpace(req.retry) == "" {
			return []answerVerdict{{"503 without Retry-After", "want a Retry-After header on every 503"}}
		}
		return nil
	case req.status >= 500:
		st.other++
		// No other server error: every request the querier sends is answerable
		// or unavailable.
		return []answerVerdict{{"5xx other than 503", "want 200 or 503"}}
	case req.status == 422 && req.at != nil:
		st.outOfRange++
		// An as-of time the state cannot answer exactly: outside the
		// partition's at_range (the error gives the range, which must exclude
		// it), or before the entity's retained buckets. Which state refused
		// is not known (the error names no offset), so nothing more is judged.
		var e struct {
			Error struct {
				Code     string `json:"code"`
				From, To *int64
			} `json:"error"`
		}
		if err := json.Unmarshal(req.body, &e); err != nil {
			return []answerVerdict{{"unreadable 422", err.Error()}}
		}
		switch e.Error.Code {
		case "at_not_retained":
		case "at_out_of_range":
			if e.Error.From == nil || e.Error.To == nil {
				return []answerVerdict{{"unreadable 422", "at_out_of_range without the range"}}
			}
			if *req.at >= *e.Error.From && *req.at <= *e.Error.To {
				return []answerVerdict{{"at_out_of_range inside its range", fmt.Sprintf("at %d is in the range [%d, %d] the error gives", *req.at, *e.Error.From, *e.Error.To)}}
			}
		default:
			return []answerVerdict{{"4xx to a well-formed request", "a 422 for ?at= is at_out_of_range or at_not_retained"}}
		}
		return nil
	case req.status >= 400:
		st.other++
		// Every request is well-formed (an existing endpoint, a valid id, no
		// parameters): no client error, whatever the state.
		return []answerVerdict{{"4xx to a well-formed request", "want 200 or 503"}}
	case req.status != 200:
		st.other++
		return []answerVerdict{{"unexpected status", "want 200 or 503"}}
	}
	st.ok++
	switch req.ep {
	case epTxn:
		return m.judgeTxn(req, env, st)
	case epBatch:
		return m.judgeBatch(req, env, st)
	case epPreview:
		return m.judgePreview(req, env, st)
	}
	v, floorsOf := m.view(), ""
	if req.ep == epRekeyed {
		gm := env.groups[req.group]
		if gm == nil {
			st.unjudged++
			return nil
		}
		st.groups++
		v, floorsOf = gm.view(), req.group
	}

	var common commonAnswer
	var va velocityAnswer
	var fa featuresAnswer
	var err error
	if req.ep == epVelocity {
		err = json.Unmarshal(req.body, &va)
		common = va.commonAnswer
	} else {
		err = json.Unmarshal(req.body, &fa)
		common = fa.commonAnswer
	}
	if err != nil {
		return []answerVerdict{{"unreadable 200", fmt.Sprintf("the body is not the documented JSON: %v", err)}}
	}
	var missing []string
	for name, ok := range map[string]bool{"entity_id": common.EntityID != nil, "known": common.Known != nil, "partition": common.Partition != nil,
		"as_of": common.AsOf != nil, "as_of_time": common.AsOfTime != nil, "last_offset": common.LastOffset != nil, "pending": common.Pending != nil,
		"at_range.from": common.AtRange != nil && common.AtRange.From != nil, "at_range.to": common.AtRange != nil && common.AtRange.To != nil} {
		if !ok {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return []answerVerdict{{"unreadable 200", "fields missing: " + strings.Join(missing, ", ")}}
	}

	// The answer is for the entity asked about, in the partition Kafka's default
	// partitioner gives its id (docs/api.md, Routing), and names an offset that
	// exists.
	p, last := *common.Partition, *common.LastOffset
	s, out, ok := placed(v, env, floorsOf, req, *common.EntityID, p, last, *common.Pending, st)
	if !ok {
		return out
	}
	// ?at=: answered only inside the state's at_range and at or after the
	// bucket of the entity's newest counted event in every window (else 422),
	// and computed at it.
	if req.at != nil {
		st.ats++
		at := *req.at
		if at < s.from || at > s.to {
			out = append(out, answerVerdict{"answer at an at outside at_range", fmt.Sprintf("at %d answered, but the state's at_range is [%d, %d]: want 422 at_out_of_range", at, s.from, s.to)})
		}
		var newest int64
		for i, tx := range s.entityEvs {
			if i == 0 || tx.time > newest {
				newest = tx.time
			}
		}
		for _, sp := range v.specs {
			if len(s.entityEvs) > 0 && floorDiv(at, sp.BucketMs) < floorDiv(newest, sp.BucketMs) {
				out = append(out, answerVerdict{"answer at an at not retained", fmt.Sprintf("at %d answered, but window %s's bucket of the entity's newest counted event (%d) is later: want 422 at_not_retained", at, sp.Name, newest)})
				break
			}
		}
		s.asOf = at
	}
	// The answer reflects the accepted events up to last_offset less the
	// pending ones (state.at): as_of is the newest counted event time, or the
	// last sweep if later; at_range runs from the last sweep to as_of plus the
	// largest window; known says whether the entity has a counted event (no
	// entity of the checker's input outlives --entity-ttl or meets
	// --max-entities).
	var diffs []string
	if *common.AsOf != s.asOf {
		diffs = append(diffs, fmt.Sprintf("as_of = %d, want %d", *common.AsOf, s.asOf))
	}
	if want := time.UnixMilli(*common.AsOf).UTC().Format(time.RFC3339Nano); *common.AsOfTime != want {
		diffs = append(diffs, fmt.Sprintf("as_of_time = %q, want %q", *common.AsOfTime, want))
	}
	if (!s.fromUnknown && *common.AtRange.From != s.from) || *common.AtRange.To != s.to {
		diffs = append(diffs, fmt.Sprintf("at_range = [%d, %d], want [%d, %d]", *common.AtRange.From, *common.AtRange.To, s.from, s.to))
	}
	if *common.Known != (len(s.counted) > 0) {
		diffs = append(diffs, fmt.Sprintf("known = %v, want %v", *common.Known, len(s.counted) > 0))
	}
	// Each window's count, sum_minor, min_minor and max_minor are those of the
	// entity's counted events in buckets floor(as_of/b)−N+1 … floor(as_of/b)
	// (docs/api.md), read at the expected as_of; an empty window is all zeros.
	// With ?window=, the windows named, in the order first named, each once.
	if req.ep == epVelocity {
		specs := m.specs
		if req.windows != nil {
			st.windowed++
			specs = nil
			for _, i := range req.windows {
				specs = append(specs, m.specs[i])
			}
		}
		if len(va.Windows) != len(specs) {
			diffs = append(diffs, fmt.Sprintf("%d windows, want %d", len(va.Windows), len(specs)))
		}
		for i := range min(len(va.Windows), len(specs)) {
			sp, got := specs[i], va.Windows[i]
			a := aggregate(s.entityEvs, func(tx genTx) bool { return inWindow(sp, s.asOf, tx.time) })
			want := windowAnswer{sp.Name, sp.WindowMs, sp.BucketMs, a.count, a.sum, a.min, a.max}
			if got != want {
				diffs = append(diffs, fmt.Sprintf("windows[%d] = %+v, want %+v", i, got, want))
			}
		}
	} else {
		diffs = append(diffs, judgeFeatures(v, req, &fa, s, st)...)
	}
	if len(diffs) > 0 {
		out = append(out, answerVerdict{"answer unlike the input's", strings.Join(diffs, "; ") + v.describe(s, p, last)})
	}
	return out
}

// judgeTxn checks a transaction call's 200 (docs/api.md, "One call for the
// keys of one transaction"): one entry per group asked with a key, none for a
// null one; each entry the status that group's lookup alone could have got
// (200, 503, or with the call's at a 422: every key is well-formed), a 503 or
// 422 with its error, and a 200's features that lookup's answer at the call's
// at, judged as one, by the same model and the same committed offsets.
func (m *apiModel) judgeTxn(req *apiRequest, env *judgeEnv, st *apiStats) []answerVerdict {
	st.txns++
	var ans struct {
		Groups map[string]json.RawMessage `json:"groups"`
	}
	if err := json.Unmarshal(req.body, &ans); err != nil || ans.Groups == nil {
		return []answerVerdict{{"unreadable 200", fmt.Sprintf("the body is not the documented JSON (an object of groups): %v", err)}}
	}
	var want, got []string
	for name, k := range req.keys {
		if k != nil {
			want = append(want, name)
		}
	}
	for name := range ans.Groups {
		got = append(got, name)
	}
	slices.Sort(want)
	slices.Sort(got)
	var out []answerVerdict
	if !slices.Equal(want, got) {
		out = append(out, answerVerdict{"transaction call: wrong groups", fmt.Sprintf("entries for %v, want one per group asked with a key: %v", got, want)})
	}
	for _, name := range got {
		k := req.keys[name]
		if k == nil {
			continue
		}
		status, features, problem := readEntry(ans.Groups[name], "features")
		if problem != "" {
			out = append(out, answerVerdict{"transaction call: unreadable entry", fmt.Sprintf("group %s: %s", name, problem)})
			continue
		}
		// The entry as the group's own lookup: its 503 needs no Retry-After
		// of its own (the call is a 200), its 422 (for the call's at) is read
		// from its error.
		sub := *req
		sub.keys, sub.entity, sub.status, sub.body, sub.retry = nil, *k, status, ans.Groups[name], "(entry)"
		if status == 200 {
			sub.body = features
		}
		if name == m.def.Group {
			sub.ep = epGroup
		} else {
			sub.ep, sub.group = epRekeyed, name
		}
		for _, v := range m.judge(&sub, env, st) {
			out = append(out, answerVerdict{"transaction call: " + v.kind, "group " + name + ": " + v.detail})
		}
	}
	return out
}

// placed checks where an answer says it read: for the entity asked about, in
// the partition Kafka's default partitioner gives its id (docs/api.md,
// Routing), at an offset that exists and not from a previous owner's state,
// with a pending the model allows; and returns the state it must reflect. ok
// is false when nothing more can be judged.
func placed(v *view, env *judgeEnv, floorsOf string, req *apiRequest, entity string, p int32, last int64, pending int, st *apiStats) (s state, out []answerVerdict, ok bool) {
	if entity != req.entity {
		return s, []answerVerdict{{"wrong entity", fmt.Sprintf("entity_id %q, want %q", entity, req.entity)}}, false
	}
	if want := apiPartition(req.entity); p != want {
		return s, []answerVerdict{{"wrong partition", fmt.Sprintf("partition %d, want %d (murmur2 of the id)", p, want)}}, false
	}
	if last < -1 || last >= v.ends[p] {
		return s, []answerVerdict{{"offset beyond the input", fmt.Sprintf("last_offset %d, want -1 to %d (the partition's end is %d)", last, v.ends[p]-1, v.ends[p])}}, false
	}
	// No answer from a previous owner's state: a partition's owner, however it
	// got it, serves from a state at or after the group's committed offset C
	// (the next offset to consume) as of its takeover: restored from a snapshot at
	// or after C, or rebuilt up to C (docs/checkpoints.md, "On assignment"); its
	// state only moves forward, and only it commits, after its state has passed
	// what it commits. So an answer sent after the group had committed C for the
	// partition reflects every offset below C: last_offset ≥ C − 1. One below it
	// comes from an instance that no longer owns the partition and does not know
	// it yet (a zombie: frozen past its session timeout, woken up). A second
	// stage's repartition partition has the same rule, where the records below
	// C (not every offset: under --exactly-once some are transaction markers)
	// must be at or below last_offset.
	if floor, at, ok := env.floors[floorsOf].before(p, req.sent); ok {
		st.floored++
		if v.behind(p, last, floor) {
			out = append(out, answerVerdict{"answer from a previous owner's state", fmt.Sprintf(
				"last_offset %d, but the group had committed offset %d for partition %d by %s, before the request was sent: want last_offset ≥ %d",
				last, floor, p, env.rel(at), floor-1)})
		}
	}

	s, err := v.at(p, last, pending, req.entity)
	if err != nil {
		return s, append(out, answerVerdict{"wrong pending", err.Error()}), false
	}
	if env.withoutDropped && floorsOf == "" {
		var counted []int
		var offs []int64
		var evs []genTx
		for i, off := range s.countedOff {
			if !env.dropped[p][off] {
				counted, offs, evs = append(counted, s.counted[i]), append(offs, off), append(evs, s.entityEvs[i])
			}
		}
		s.counted, s.countedOff, s.entityEvs = counted, offs, evs
	}
	return s, out, true
}

// readEntry reads one entry of a transaction call or one result of a batch: its
// status and, under field, its answer; problem says what makes it unreadable (a
// 200 without its answer, another status without an error code).
func readEntry(raw json.RawMessage, field string) (status int, answer json.RawMessage, problem string) {
	var e map[string]json.RawMessage
	var er *struct{ Code string }
	if err := json.Unmarshal(raw, &e); err != nil {
		return 0, nil, err.Error()
	}
	if err := json.Unmarshal(e["status"], &status); e["status"] != nil && err != nil {
		return 0, nil, err.Error()
	}
	if err := json.Unmarshal(e["error"], &er); e["error"] != nil && err != nil {
		return 0, nil, err.Error()
	}
	switch answer = e[field]; {
	case status == 200 && answer == nil:
		return status, nil, "status 200 without " + field
	case status != 200 && (er == nil || er.Code == ""):
		return status, nil, fmt.Sprintf("status %d without an error code", status)
	}
	return status, answer, ""
}

// judgeBatch checks a batch's 200 (docs/api.md, POST /v1/velocity:batch): one
// result per id, in request order, each the status that id's lookup alone
// could have got (200, 503, or a 422 for an at), a 200's velocity judged as
// that lookup's answer, with the batch's at and windows; and the ids of one
// partition that are answered 200 were read from one state, since a batch
// reads each partition once: the same last_offset and pending.
func (m *apiModel) judgeBatch(req *apiRequest, env *judgeEnv, st *apiStats) []answerVerdict {
	st.batches++
	var ans struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := json.Unmarshal(req.body, &ans); err != nil || ans.Results == nil {
		return []answerVerdict{{"batch: unreadable 200", fmt.Sprintf("want {\"results\": [...]}: %v", err)}}
	}
	var out []answerVerdict
	if len(ans.Results) != len(req.ids) {
		out = append(out, answerVerdict{"batch: wrong number of results", fmt.Sprintf("%d results for %d ids", len(ans.Results), len(req.ids))})
	}
	type read struct {
		last    int64
		pending int
		i       int
	}
	reads := map[int32]read{}
	for i, raw := range ans.Results[:min(len(ans.Results), len(req.ids))] {
		id := req.ids[i]
		status, velocity, problem := readEntry(raw, "velocity")
		if problem != "" {
			out = append(out, answerVerdict{"batch: unreadable result", fmt.Sprintf("result %d (%s): %s", i, id, problem)})
			continue
		}
		// The result as the id's own lookup: its 503 needs no Retry-After of
		// its own (the batch is a 200), its 422 is read from its error.
		sub := *req
		sub.ep, sub.ids, sub.entity, sub.status, sub.body, sub.retry = epVelocity, nil, id, status, raw, "(entry)"
		if status == 200 {
			sub.body = velocity
		}
		for _, v := range m.judge(&sub, env, st) {
			out = append(out, answerVerdict{"batch: " + v.kind, fmt.Sprintf("result %d (%s): %s", i, id, v.detail)})
		}
		var c struct {
			Partition  *int32 `json:"partition"`
			LastOffset *int64 `json:"last_offset"`
			Pending    *int   `json:"pending"`
		}
		if status != 200 || json.Unmarshal(velocity, &c) != nil || c.Partition == nil || c.LastOffset == nil || c.Pending == nil {
			continue
		}
		if r, ok := reads[*c.Partition]; !ok {
			reads[*c.Partition] = read{*c.LastOffset, *c.Pending, i}
		} else if r.last != *c.LastOffset || r.pending != *c.Pending {
			out = append(out, answerVerdict{"batch: one partition read at two states", fmt.Sprintf("partition %d: result %d at last_offset %d, pending %d; result %d at last_offset %d, pending %d",
				*c.Partition, r.i, r.last, r.pending, i, *c.LastOffset, *c.Pending)})
		}
	}
	return out
}

// judgeFeatures checks a features answer (the entity's, a group's through the
// group endpoint) against the definition's features of the counted events.
func judgeFeatures(v *view, req *apiRequest, fa *featuresAnswer, s state, st *apiStats) []string {
	def := v.def
	var diffs []string
	if (req.ep == epGroup || req.ep == epRekeyed) && (fa.Group == nil || *fa.Group != v.group) {
		got := "none"
		if fa.Group != nil {
			got = strconv.Quote(*fa.Group)
		}
		diffs = append(diffs, fmt.Sprintf("group = %s, want %q", got, v.group))
	}
	if fa.Definition == nil || *fa.Definition != v.label {
		diffs = append(diffs, fmt.Sprintf("definition = %v, want %q", strOr(fa.Definition), v.label))
	}
	want := map[string]bool{}
	wantExact := map[string]bool{}
	for _, f := range def.Features {
		keep := func(tx genTx) bool { return matches(def, f.Filter, tx) }
		// A distinct count is exact while the entity's set never held more than
		// max_exact values (docs/feature-outputs.md): certainly so when all its
		// counted events together have no more distinct values. Beyond that the
		// set may sample, and the estimate (values held × 2^s) depends on which
		// hashes it kept: the checker does not model the sample, so it judges a
		// window's count only when the answer says it is exact, which it then
		// must be, and leaves an estimate out (counted in the summary).
		judged := true
		if f.Agg == definition.AggDistinctCount {
			name := f.Name + "_exact"
			wantExact[name] = true
			all := map[string]bool{}
			for _, tx := range s.entityEvs {
				if keep(tx) {
					v, _ := txField(tx, f.Field)
					all[v] = true
				}
			}
			got, ok := fa.Exact[name]
			switch {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("exact.%s missing", name))
			case len(all) <= f.MaxExact && !got:
				diffs = append(diffs, fmt.Sprintf("exact.%s = false, want true: the entity's counted events have %d distinct values, max_exact %d", name, len(all), f.MaxExact))
			case !got:
				judged = false
				st.estimates++
			}
		}
		for _, wi := range f.Windows {
			sp := def.Windows[wi]
			name := f.Name + "_" + sp.Name
			want[name] = true
			raw, ok := fa.Features[name]
			if !ok {
				diffs = append(diffs, fmt.Sprintf("features.%s missing", name))
				continue
			}
			if !judged {
				continue
			}
			in := func(tx genTx) bool { return keep(tx) && inWindow(sp, s.asOf, tx.time) }
			a := aggregate(s.entityEvs, in)
			var exp string // the JSON value expected
			switch f.Agg {
			case definition.AggCount:
				exp = strconv.FormatInt(a.count, 10)
			case definition.AggSum:
				exp = strconv.FormatInt(a.sum, 10)
			case definition.AggMin, definition.AggMax:
				exp = "null" // no matching event in the window
				if a.count > 0 && f.Agg == definition.AggMin {
					exp = strconv.FormatInt(a.min, 10)
				} else if a.count > 0 {
					exp = strconv.FormatInt(a.max, 10)
				}
			case definition.AggDistinctCount:
				vals := map[string]bool{}
				for _, tx := range s.entityEvs {
					if in(tx) {
						v, _ := txField(tx, f.Field)
						vals[v] = true
					}
				}
				exp = strconv.Itoa(len(vals))
			}
			if got := string(bytes.TrimSpace(raw)); got != exp {
				diffs = append(diffs, fmt.Sprintf("features.%s = %s, want %s", name, got, exp))
			}
		}
	}
	for name := range fa.Features {
		if !want[name] {
			diffs = append(diffs, fmt.Sprintf("features.%s is not the definition's", name))
		}
	}
	for name := range fa.Exact {
		if !wantExact[name] {
			diffs = append(diffs, fmt.Sprintf("exact.%s is not the definition's", name))
		}
	}
	return diffs
}

func strOr(s *string) string {
	if s == nil {
		return "none"
	}
	return strconv.Quote(*s)
}

// describe says what the expected values were computed from, for a failure.
func (s state) describe(m *apiModel, p int32, last int64) string {
	pm := &m.parts[p]
	var b strings.Builder
	fmt.Fprintf(&b, "\n      expected from partition %d up to offset %d: %d accepted events, watermark %d, %d of them above it (pending ones: the last %d by offset",
		p, last, s.accepted, s.wm, len(s.candidates), len(s.pending))
	if len(s.pending) > 0 {
		fmt.Fprintf(&b, ", offsets %d-%d", pm.acc[s.pending[len(s.pending)-1]].off, pm.acc[s.pending[0]].off)
	}
	fmt.Fprintf(&b, "), last sweep %d, newest counted %d (counted: %v), as_of %d, at_range [%d, %d]; the entity's counted events: %d",
		s.lastSweep, s.newest, s.hasNewest, s.asOf, s.from, s.to, len(s.counted))
	for i, idx := range s.counted[max(0, len(s.counted)-4):] {
		if i == 0 && len(s.counted) > 4 {
			b.WriteString(", the last four:")
		}
		e := pm.acc[idx]
		fmt.Fprintf(&b, " %d@%d (t %d, amount %d, %q)", p, e.off, e.tx.time, e.tx.amount, e.tx.currency)
	}
	return b.String()
}

// checkAnswers judges every answer of one group and returns one paragraph per
// kind of broken invariant, each with the count and the first few requests
// (when, which slot, what, the answer, the expectation).
func (m *apiModel) checkAnswers(reqs []*apiRequest, env *judgeEnv, st *apiStats) []string {
	slices.SortFunc(reqs, func(a, b *apiRequest) int { return a.sent.Compare(b.sent) })
	st.sent += len(reqs)
	type bad struct {
		n        int
		examples []string
	}
	kinds := map[string]*bad{}
	var order []string
	for _, req := range reqs {
		for _, v := range m.judge(req, env, st) {
			b := kinds[v.kind]
			if b == nil {
				b = &bad{}
				kinds[v.kind] = b
				order = append(order, v.kind)
			}
			b.n++
			if len(b.examples) < 3 {
				body := string(bytes.TrimSpace(req.body))
				if len(body) > 700 {
					body = body[:700] + "…"
				}
				method := "GET"
				if req.ep == epTxn || req.ep == epBatch {
					method = "POST"
				}
				b.examples = append(b.examples, fmt.Sprintf("\n    %s %s (slot %d, sent %s, answered %s): %d, Retry-After %q, Content-Type %q, body %s\n      %s",
					method, req.url, req.slot, env.rel(req.sent), env.rel(req.answered), req.status, req.retry, req.ctype, body, v.detail))
			}
		}
	}
	var fails []string
	for _, k := range order {
		b := kinds[k]
		fails = append(fails, fmt.Sprintf("query API: %s: %d of %d answers; first:%s", k, b.n, len(reqs), strings.Join(b.examples, "")))
	}
	return fails
}

// lateOnlyLive lists, by input partition, the offsets that some output of the
// group (at any checkpoint) dead-letters `late` while replay counts them
// (judgeEnv.dropped). Nothing without replay's outputs.
func lateOnlyLive(replay map[srcKey][]output, cps []checkpoint) map[int32]map[int64]bool {
	dropped := map[int32]map[int64]bool{}
	if replay == nil {
		return dropped
	}
	for _, cp := range cps {
		for k, outs := range cp.outs {
			if ref := replay[k]; len(ref) != 1 || ref[0].dead {
				continue
			}
			if !slices.ContainsFunc(outs, func(o output) bool { return o.dead && o.reason == "late" }) {
				continue
			}
			if dropped[k.part] == nil {
				dropped[k.part] = map[int64]bool{}
			}
			dropped[k.part][k.offset] = true
		}
	}
	return dropped
}
