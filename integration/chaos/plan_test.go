//go:build integration

package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// faultKind is one kind of fault a phase of a schedule may carry.
type faultKind int

const (
	faultNone       faultKind = iota
	faultKill                 // SIGKILL instance Slot at At, start it again Dur later
	faultFreeze               // SIGSTOP instance Slot at At, SIGCONT Dur later (Dur > --session-timeout)
	faultScaleUp              // start instances 1 and 2 at At: 1 → 3
	faultScaleDown            // SIGTERM instances 1 and 2 at At: 3 → 1
	faultBroker               // SIGKILL the broker (of a cluster: the Nodes) at At, restart it on its data Dur later
	faultGraceful             // SIGTERM every running instance at At, start them again Dur later (a quiet phase: no new input)
	faultNodeFreeze           // a cluster only: SIGSTOP the node in Nodes at At, SIGCONT Dur later (Dur > the brokers' session with the controller)
	faultRolling              // a cluster only: from At, stop and restart every node in turn, Nodes first, each once the others are in sync
	faultNetCut               // cut instance Slot's network path to the brokers (of a cluster: to the Nodes only, if any) at At, heal it Dur later (Dur > --session-timeout); its API stays reachable
	faultRegistry             // a registry run only: take the schema registry down at At for Dur, and SIGKILL instance Slot 500 ms into it and start it again at once
	// faultIdleKill is never a phase's Fault: it names, in the run's fault
	// counts, a paused burst's IdleKill, which comes on top of its fault;
	// faultIdleFreeze, likewise, a quiet phase's IdleFreeze.
	faultIdleKill
	faultIdleFreeze
)

func (k faultKind) String() string {
	return [...]string{"none", "sigkill", "sigstop", "scale-up", "scale-down", "broker-restart", "graceful-restart", "node-freeze", "rolling-restart", "net-cut", "registry-outage", "idle-kill", "idle-freeze"}[k]
}

// phase is one step of a schedule: a burst of input (Records > 0) or a quiet
// period (Records == 0) lasting Length, and at most one fault starting At into
// it. A phase ends when both its input and its fault are over.
type phase struct {
	Records int
	Length  time.Duration
	Fault   faultKind
	At      time.Duration
	Slot    int           // the instance of faultKill and faultFreeze
	Dur     time.Duration // restart delay, freeze length or broker downtime
	// Nodes are the cluster nodes of faultBroker and faultNodeFreeze, and of
	// a partial faultNetCut (none: a cut from every node); none with a single
	// broker.
	Nodes nodeSet
	// Pause > 0: the burst's input stops PauseAt into it for Pause, longer
	// than --idle-timeout, then goes on where it was (no new alignment): the
	// partitions, caught up and quiet, release their reorder buffers by the
	// idle rule, and the rest of the burst brings events older than some of
	// the released ones (idle_test.go).
	PauseAt, Pause time.Duration
	// IdleKill, in a paused burst: SIGKILL instance IdleKillSlot (of both
	// groups) IdleKillAfter past the pause's start + --idle-timeout, when the
	// idle rule has just released the reorder buffers and their features
	// records are out, but before the next checkpoint (--checkpoint-interval)
	// saves it in a snapshot and commits its position, and start it again
	// IdleKillDur later. The next owner resumes from the checkpoint before
	// the release (a snapshot, or a warm-up to the committed offset), with the
	// released events pending again, and the rest of the burst (events older
	// than some released ones) reaches it in one piece: it counts them in
	// replay's order, unlike the first outputs, and no output shows an event
	// counted out of order. The kill comes on top of the phase's Fault, on
	// another instance than that fault's, and before the burst goes on.
	IdleKill                   bool
	IdleKillSlot               int
	IdleKillAfter, IdleKillDur time.Duration
	// IdleFreeze, in a quiet phase: SIGSTOP instance IdleFreezeSlot (of both
	// groups) IdleFreezeAfter past the phase's start + --idle-timeout, when its
	// partitions have found their input quiet (a re-keyed group's first stage
	// has declared it idle to the second stages), and SIGCONT it IdleFreezeDur
	// later: longer than the declaration's lease (the allowed lateness, 1 s),
	// shorter than the session timeout, so that it keeps its partitions. The
	// next phase's input begins meanwhile, unread on the frozen instance's
	// partitions; the other partitions must not carry a group's order past it
	// (docs/repartition.md, the idle rule: the lease runs out). It comes on top
	// of the phase's Fault, on another instance than that fault's.
	IdleFreeze                     bool
	IdleFreezeSlot                 int
	IdleFreezeAfter, IdleFreezeDur time.Duration
}

func (p phase) String() string {
	var b strings.Builder
	if p.Records > 0 {
		fmt.Fprintf(&b, "burst of %d records over %s", p.Records, p.Length)
		if p.Pause > 0 {
			fmt.Fprintf(&b, ", paused at +%s for %s", p.PauseAt, p.Pause)
		}
		if p.IdleKill {
			fmt.Fprintf(&b, ", idle kill: SIGKILL instance %d %s past the pause's start + the idle timeout (meant to fall after the idle release, before its checkpoint), start it again %s later",
				p.IdleKillSlot, p.IdleKillAfter, p.IdleKillDur)
		}
	} else {
		fmt.Fprintf(&b, "quiet for %s", p.Length)
		if p.IdleFreeze {
			fmt.Fprintf(&b, ", idle freeze: SIGSTOP instance %d %s past the idle timeout (after its idle declarations), SIGCONT %s later (within the session)",
				p.IdleFreezeSlot, p.IdleFreezeAfter, p.IdleFreezeDur)
		}
	}
	switch p.Fault {
	case faultNone:
	case faultKill:
		fmt.Fprintf(&b, "; at +%s SIGKILL instance %d, start it again %s later", p.At, p.Slot, p.Dur)
	case faultFreeze:
		fmt.Fprintf(&b, "; at +%s SIGSTOP instance %d, SIGCONT %s later", p.At, p.Slot, p.Dur)
	case faultNetCut:
		if p.Nodes == 0 {
			fmt.Fprintf(&b, "; at +%s cut instance %d off from the brokers, heal it %s later", p.At, p.Slot, p.Dur)
		} else {
			fmt.Fprintf(&b, "; at +%s cut instance %d off from broker node %s only, heal it %s later", p.At, p.Slot, nodeNames(p.Nodes), p.Dur)
		}
	case faultBroker:
		if p.Nodes == 0 {
			fmt.Fprintf(&b, "; at +%s SIGKILL the broker, restart it %s later", p.At, p.Dur)
		} else {
			fmt.Fprintf(&b, "; at +%s SIGKILL broker node(s) %s, restart them %s later", p.At, nodeNames(p.Nodes), p.Dur)
		}
	case faultNodeFreeze:
		fmt.Fprintf(&b, "; at +%s SIGSTOP broker node %s, SIGCONT %s later", p.At, nodeNames(p.Nodes), p.Dur)
	case faultRolling:
		fmt.Fprintf(&b, "; at +%s a rolling restart of the brokers from node %s", p.At, nodeNames(p.Nodes))
	case faultGraceful:
		fmt.Fprintf(&b, "; at +%s SIGTERM every instance, start them again %s later", p.At, p.Dur)
	case faultRegistry:
		fmt.Fprintf(&b, "; at +%s take the schema registry down for %s, SIGKILL instance %d 500ms into it and start it again at once", p.At, p.Dur, p.Slot)
	default:
		fmt.Fprintf(&b, "; at +%s %s", p.At, p.Fault)
	}
	return b.String()
}

// nodeSet is a set of a cluster's nodes by index (bit i: node i, whose node.id is
// i+1): a value, so that phases stay comparable.
type nodeSet uint8

func nodesOf(idx ...int) nodeSet {
	var s nodeSet
	for _, i := range idx {
		s |= 1 << i
	}
	return s
}

// list is the set's node indexes, in order.
func (s nodeSet) list() []int {
	var out []int
	for i := 0; i < 8; i++ {
		if s&(1<<i) != 0 {
			out = append(out, i)
		}
	}
	return out
}

// nodeNames are the set's nodes as the cluster numbers them (node.id).
func nodeNames(s nodeSet) string {
	var n []string
	for _, i := range s.list() {
		n = append(n, fmt.Sprint(i+1))
	}
	return strings.Join(n, " and ")
}

// schedule is everything a run does that its seed decides: the phases, and
// the seed of the input generator. Wall-clock effects (how fast a process
// restarts, when a rebalance settles) are not in it; they are logged in the
// run's timeline.
type schedule struct {
	Seed      uint64
	InputSeed uint64
	// Late is the --late policy of the run and its replay: "dlq", or
	// "apply" in about half the runs that may use it (planTimes.lateApply),
	// so that late events counted at once, their ids remembered by dedupe and
	// the wider idle sweep cross crashes, moves and restores too.
	Late string
	// Registry: the input is in the Confluent wire format, and the run and its
	// replay read it through a schema registry (a fake, in the test process),
	// in about half the runs that may (planTimes.registry). Every round then
	// also takes the registry down (faultRegistry).
	Registry bool
	Phases   []phase
}

// planTimes are the service's timing flags the schedule is built around.
type planTimes struct {
	session, idle time.Duration
	// pauses: one burst in three pauses past the idle timeout. Not with
	// re-keyed groups, whose second stages would then count out of order in
	// nearly every run, which their topic checks do not bound
	// (docs/fault-checker.md).
	pauses bool
	// idleKills: some of the paused bursts also SIGKILL an instance just
	// after the idle release, before its commit (phase.IdleKill). With
	// pauses only; their draws come from a source of their own, so that the
	// rest of a seed's schedule, its pauses included, is the same without.
	idleKills bool
	// idleFreezes: about one quiet phase in five also SIGSTOPs an instance
	// past the idle timeout, within the session (phase.IdleFreeze), every
	// variant; from a source of their own too.
	idleFreezes bool
	// nodes > 1: the broker is a cluster of that many nodes (replication
	// factor 3, min.insync.replicas 2), whose session with the controller is
	// nodeSession. A broker restart kills one node, or in one round in three
	// two at once (below min.insync.replicas, and no controller quorum with
	// three), and every round also freezes one node past nodeSession, so
	// that the controller fences it and moves its leadership while it sleeps.
	// Every other round, the second first, also restarts the nodes one by
	// one, cleanly, as an operator's rolling restart does (not in the first,
	// which is often the only one: it takes the longest).
	nodes       int
	nodeSession time.Duration
	// lateApply: the run may use --late=apply (not with re-keyed groups,
	// which refuse it).
	lateApply bool
	// registry: the run may read its input through a schema registry (every
	// variant may: a definition's mapping and a re-keyed group's registered
	// output are paths of their own).
	registry bool
}

// makeSchedule builds the schedule of seed: rounds until the planned length
// reaches at least minLength (always one round at least). Each round holds, in
// a seeded order, two SIGKILLs, a SIGSTOP past the session timeout, a network
// cut of one instance past the session timeout, a broker restart, a graceful
// restart of every instance with no input, and a scale-up 1 → 3 followed later
// by a scale-down 3 → 1 (in the first round and every other one after it the
// SIGSTOP and the cut fall between the two), each inside a burst
// or a quiet period longer than the idle timeout, with plain bursts and quiet
// periods between them. The schedule ends with one instance running.
func makeSchedule(seed uint64, minLength time.Duration, pt planTimes) schedule {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73))
	// The pauses draw from a source of their own, so that they leave the rest
	// of a seed's schedule as it is without them.
	prng := rand.New(rand.NewPCG(seed, 0x7061757365))
	// So do a cluster's faults: with a single broker a seed's schedule is the
	// one it always was.
	crng := rand.New(rand.NewPCG(seed, 0x636c7573746572))
	nrng := rand.New(rand.NewPCG(seed, 0x6e6574637574)) // the network cuts'
	s := schedule{Seed: seed, InputSeed: rng.Uint64(), Late: "dlq"}
	if lrng := rand.New(rand.NewPCG(seed, 0x6c617465)); pt.lateApply && lrng.IntN(2) == 0 {
		s.Late = "apply"
	}
	rrng := rand.New(rand.NewPCG(seed, 0x7265676973747279)) // the registry's
	s.Registry = pt.registry && rrng.IntN(2) == 0
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	burst := func() phase {
		length := ms(1500, 3500)
		rate := 300 + rng.IntN(1200) // records per second
		p := phase{Records: max(1, int(float64(rate)*length.Seconds())), Length: length}
		if pt.pauses && prng.IntN(3) == 0 {
			p.PauseAt = (length/5 + time.Duration(prng.Int64N(int64(length/2)))).Round(time.Millisecond)
			p.Pause = pt.idle + time.Duration(500+prng.IntN(1001))*time.Millisecond
		}
		return p
	}
	quiet := func() phase { return phase{Length: pt.idle + ms(300, 1500)} }
	// The idle kills draw from a source of their own as well: a seed's
	// schedule, its pauses included, is the one it was before them.
	krng := rand.New(rand.NewPCG(seed, 0x69646c656b696c6c))
	// idleKill gives half of the paused bursts a kill after the idle release
	// (phase.IdleKill) of one of the running instances that p's own fault
	// leaves alone: not the one it kills, freezes or cuts off, and, when it
	// scales the group up or down, instance 0 (the one running throughout).
	// running is the number of instances when p begins.
	idleKill := func(p *phase, running int) {
		if !pt.idleKills || p.Pause == 0 || krng.IntN(2) != 0 {
			return
		}
		var slots []int
		for i := range running {
			if p.spares(i) {
				slots = append(slots, i)
			}
		}
		if len(slots) == 0 {
			return // p's fault takes the only instance running: about one in five
		}
		// The idle verdict comes a tick or two (100 ms each) after the
		// idle timeout from the last record (it waits for the broker's
		// word that nothing is left to read), so the release is out some
		// 100-300 ms past the pause's start + the idle timeout (the runs
		// show 150-250 ms); the next checkpoint saves and commits it within
		// --checkpoint-interval (1 s) of it, on each partition at its own
		// moment (a quiet partition saves nothing until then). 150-850 ms
		// after: mostly in between, on some partition at least; and before
		// the burst goes on (the pause outlasts the idle timeout by 500 ms
		// at least), or the first owner would count the older events out
		// of order itself, in outputs that show it.
		hi := min(850*time.Millisecond, p.Pause-pt.idle-100*time.Millisecond)
		p.IdleKill = true
		p.IdleKillSlot = slots[krng.IntN(len(slots))]
		p.IdleKillAfter = 150*time.Millisecond + time.Duration(krng.Int64N(int64(hi-150*time.Millisecond)/1e6+1))*time.Millisecond
		p.IdleKillDur = time.Duration(krng.IntN(1501)) * time.Millisecond
	}
	running := 1
	pick := func() int { return rng.IntN(running) }
	for round := 0; round == 0 || s.length() < minLength; round++ {
		events := []faultKind{faultKill, faultKill, faultFreeze, faultBroker, faultGraceful, faultScaleUp}
		rng.Shuffle(len(events), func(i, j int) { events[i], events[j] = events[j], events[i] })
		if pt.nodes > 1 {
			events = slices.Insert(events, crng.IntN(len(events)+1), faultNodeFreeze)
			if round%2 == 1 {
				events = slices.Insert(events, crng.IntN(len(events)+1), faultRolling)
			}
		}
		up := slices.Index(events, faultScaleUp)
		down := up + 1 + rng.IntN(len(events)-up)
		events = slices.Insert(events, down, faultScaleDown)
		if round%2 == 0 {
			// Every other round, the first (often the only one) included,
			// freezes one of three instances: only then is there another
			// owner to take the frozen one's partitions over and commit past
			// its state before it wakes (a zombie), which a shuffle alone gave
			// about one round in five.
			events = slices.DeleteFunc(events, func(k faultKind) bool { return k == faultFreeze })
			up, down = slices.Index(events, faultScaleUp), slices.Index(events, faultScaleDown)
			events = slices.Insert(events, up+1+rng.IntN(down-up), faultFreeze)
		}
		// A network cut of one instance: in the rounds that freeze one of
		// three, also one of three (the others take its partitions over and
		// commit past it while it is cut off, and its query API stays
		// reachable: an old owner that does not know it yet), else anywhere.
		if up, down := slices.Index(events, faultScaleUp), slices.Index(events, faultScaleDown); round%2 == 0 {
			events = slices.Insert(events, up+1+nrng.IntN(down-up), faultNetCut)
		} else {
			events = slices.Insert(events, nrng.IntN(len(events)+1), faultNetCut)
		}
		if s.Registry {
			events = slices.Insert(events, rrng.IntN(len(events)+1), faultRegistry)
		}
		for _, ev := range events {
			if rng.IntN(3) == 0 {
				if rng.IntN(3) == 0 {
					s.Phases = append(s.Phases, quiet())
				} else {
					b := burst()
					idleKill(&b, running)
					s.Phases = append(s.Phases, b)
				}
			}
			before := running
			var p phase
			if ev == faultGraceful || rng.IntN(10) < 3 {
				p = quiet()
			} else {
				p = burst()
			}
			p.Fault = ev
			switch ev {
			case faultKill:
				p.At, p.Slot, p.Dur = ms(0, int(p.Length.Milliseconds())), pick(), ms(0, 1500)
			case faultNetCut:
				// As a freeze, but the instance runs on, cut off.
				p.At = time.Duration(nrng.Int64N(int64(p.Length/2) + 1)).Round(time.Millisecond)
				p.Slot, p.Dur = nrng.IntN(running), pt.session+time.Duration(1500+nrng.IntN(3501))*time.Millisecond
				if pt.nodes > 1 && crng.IntN(2) == 0 {
					// Half of a cluster's cuts are partial: from one node
					// only, the instance reaching the others. Cut from the
					// group coordinator's node, it falls out of the group
					// while it still fetches and produces: an old owner that
					// does not know it; from a leader's, those partitions
					// stall while it stays their owner.
					p.Nodes = nodesOf(crng.IntN(pt.nodes))
				}
			case faultFreeze:
				// 1.5-5 s past the session timeout: the new owner needs a few
				// seconds after the rebalance to commit past the frozen state.
				p.At, p.Slot, p.Dur = ms(0, int(p.Length.Milliseconds()/2)), pick(), pt.session+ms(1500, 5000)
			case faultBroker:
				// In the first half, so that a burst usually goes on after the
				// outage: the producer's retries and the consumers' return meet
				// the rest of the burst.
				p.At, p.Dur = ms(0, int(p.Length.Milliseconds()/2)), ms(1000, 3000)
				if pt.nodes > 1 {
					first := crng.IntN(pt.nodes)
					p.Nodes = nodesOf(first)
					if pt.nodes > 2 && crng.IntN(3) == 0 {
						p.Nodes |= nodesOf((first + 1 + crng.IntN(pt.nodes-1)) % pt.nodes)
					}
				}
			case faultNodeFreeze:
				// In the first half, as a broker restart, and 1-5 s past the
				// node's session: its leadership moves while it sleeps, and it
				// wakes a stale leader with the rest of the burst going on.
				p.At = time.Duration(crng.Int64N(int64(p.Length/2) + 1)).Round(time.Millisecond)
				p.Dur = pt.nodeSession + time.Duration(1000+crng.IntN(4001))*time.Millisecond
				p.Nodes = nodesOf(crng.IntN(pt.nodes))
			case faultRolling:
				p.At = time.Duration(crng.Int64N(int64(p.Length/2) + 1)).Round(time.Millisecond)
				p.Nodes = nodesOf(crng.IntN(pt.nodes))
			case faultGraceful:
				p.At, p.Dur = ms(0, 500), ms(500, 2000)
			case faultRegistry:
				// In the first half, so that the burst goes on against a
				// registry that is down; 2-8 s, so that the instance started
				// again inside it waits for it (it has no schema cached) past
				// the idle timeout, within the 30 s the start gives it.
				p.At = time.Duration(rrng.Int64N(int64(p.Length/2) + 1)).Round(time.Millisecond)
				p.Slot, p.Dur = rrng.IntN(running), time.Duration(2000+rrng.IntN(6001))*time.Millisecond
			case faultScaleUp:
				p.At = ms(0, int(p.Length.Milliseconds()))
				running = 3
			case faultScaleDown:
				p.At = ms(0, int(p.Length.Milliseconds()))
				running = 1
			}
			idleKill(&p, before)
			s.Phases = append(s.Phases, p)
		}
	}
	if pt.idleFreezes {
		addIdleFreezes(&s, seed, pt)
	}
	return s
}

// spares reports whether p's fault leaves instance k alone, for a fault of
// another kind on top of it: not the instance a kill, freeze, cut or registry
// fault takes, no instance but 0 while the group scales, none in a graceful
// restart, which stops every instance.
func (p *phase) spares(k int) bool {
	switch p.Fault {
	case faultGraceful:
		return false
	case faultScaleUp, faultScaleDown:
		return k == 0
	case faultKill, faultFreeze, faultNetCut, faultRegistry:
		return k != p.Slot
	}
	return true
}

// addIdleFreezes gives half the quiet phases, other than the last, an
// IdleFreeze if an instance can take it (about one in five in all). The freeze outlasts its phase into the next one, so its instance is
// one that neither phase's fault touches: not the one a kill, freeze, cut or
// registry fault takes, no instance but 0 while the group scales, none in a
// graceful restart (which stops every instance); the next phase's idle kill
// leaves a frozen instance alone. Its draws come from a source of their own.
func addIdleFreezes(s *schedule, seed uint64, pt planTimes) {
	frng := rand.New(rand.NewPCG(seed, 0x69646c65667a))
	running := 1
	for i := range s.Phases {
		p := &s.Phases[i]
		before := running
		switch p.Fault {
		case faultScaleUp:
			running = 3
		case faultScaleDown:
			running = 1
		}
		if i+1 == len(s.Phases) || p.Records > 0 || frng.IntN(2) != 0 {
			continue
		}
		next := &s.Phases[i+1]
		var slots []int
		for k := range min(before, running) {
			if p.spares(k) && next.spares(k) {
				slots = append(slots, k)
			}
		}
		if len(slots) == 0 {
			continue
		}
		// After the declarations (a tick or two past the idle timeout from the
		// last record, which came at most at the phase's start), and before the
		// next phase begins, which it then does on a frozen instance.
		hi := p.Length - pt.idle - 100*time.Millisecond
		long := min(4500*time.Millisecond, pt.session-1500*time.Millisecond)
		p.IdleFreeze = true
		p.IdleFreezeSlot = slots[frng.IntN(len(slots))]
		p.IdleFreezeAfter = 150*time.Millisecond + time.Duration(frng.Int64N(int64(hi-150*time.Millisecond)/1e6+1))*time.Millisecond
		p.IdleFreezeDur = 1200*time.Millisecond + time.Duration(frng.Int64N(int64(long-1200*time.Millisecond)/1e6+1))*time.Millisecond
	}
}

// length is the schedule's planned length (a broker restart and the
// processes' starts and stops make the real one longer).
func (s schedule) length() time.Duration {
	var d time.Duration
	for _, p := range s.Phases {
		d += max(p.Length, p.At+p.Dur)
	}
	return d
}

func (s schedule) records() int {
	n := 0
	for _, p := range s.Phases {
		n += p.Records
	}
	return n
}

func (s schedule) String() string {
	var b strings.Builder
	reg := ""
	if s.Registry {
		reg = ", through a schema registry"
	}
	fmt.Fprintf(&b, "schedule of seed %d (input seed %d, --late=%s%s): %d phases, %s planned, %d records\n",
		s.Seed, s.InputSeed, s.Late, reg, len(s.Phases), s.length(), s.records())
	for i, p := range s.Phases {
		fmt.Fprintf(&b, "  phase %2d: %s\n", i, p)
	}
	return b.String()
}

// TestChaosSchedule needs no broker: a seed always gives the same schedule,
// every round carries each kind of fault, faults act only on running
// instances, each freeze outlasts the session timeout, each quiet period the
// idle timeout, and the schedule ends with one instance.
func TestChaosSchedule(t *testing.T) {
	pt := planTimes{session: 6 * time.Second, idle: 2 * time.Second}
	for seed := uint64(1); seed <= 200; seed++ {
		a, b := makeSchedule(seed, 3*time.Minute, pt), makeSchedule(seed, 3*time.Minute, pt)
		if a.String() != b.String() {
			t.Fatalf("seed %d: two schedules differ:\n%s\n%s", seed, a, b)
		}
		if a.length() < 3*time.Minute {
			t.Fatalf("seed %d: planned %s, want at least 3m", seed, a.length())
		}
		seen := map[faultKind]int{}
		running, freezesOfThree, cutsOfThree := 1, 0, 0
		for i, p := range a.Phases {
			seen[p.Fault]++
			if p.Fault == faultFreeze && running == 3 {
				freezesOfThree++
			}
			if p.Fault == faultNetCut && running == 3 {
				cutsOfThree++
			}
			switch p.Fault {
			case faultKill, faultFreeze, faultNetCut:
				if p.Slot >= running {
					t.Fatalf("seed %d phase %d: %s of instance %d with %d running", seed, i, p.Fault, p.Slot, running)
				}
			case faultScaleUp:
				if running != 1 {
					t.Fatalf("seed %d phase %d: scale-up with %d running", seed, i, running)
				}
				running = 3
			case faultScaleDown:
				if running != 3 {
					t.Fatalf("seed %d phase %d: scale-down with %d running", seed, i, running)
				}
				running = 1
			}
			if p.Nodes != 0 || p.Fault == faultNodeFreeze {
				t.Fatalf("seed %d phase %d: %s on a single broker", seed, i, p)
			}
			if (p.Fault == faultFreeze || p.Fault == faultNetCut) && p.Dur <= pt.session {
				t.Fatalf("seed %d phase %d: %s of %s within the session timeout", seed, i, p.Fault, p.Dur)
			}
			if p.Records == 0 && p.Length <= pt.idle {
				t.Fatalf("seed %d phase %d: quiet for %s, not past the idle timeout", seed, i, p.Length)
			}
			if p.Fault == faultGraceful && p.Records > 0 {
				t.Fatalf("seed %d phase %d: input during a graceful restart", seed, i)
			}
		}
		if running != 1 {
			t.Fatalf("seed %d: ends with %d instances", seed, running)
		}
		if rounds := seen[faultNetCut]; rounds != seen[faultFreeze] || cutsOfThree < (rounds+1)/2 {
			t.Fatalf("seed %d: %d network cuts, %d of them with three instances running, over %d rounds", seed, rounds, cutsOfThree, seen[faultFreeze])
		}
		if rounds := seen[faultFreeze]; freezesOfThree < (rounds+1)/2 {
			t.Fatalf("seed %d: %d of %d freezes with three instances running, want at least %d", seed, freezesOfThree, rounds, (rounds+1)/2)
		}
		for _, k := range []faultKind{faultKill, faultFreeze, faultScaleUp, faultScaleDown, faultBroker, faultGraceful, faultNetCut} {
			if seen[k] == 0 {
				t.Fatalf("seed %d: no %s", seed, k)
			}
		}
	}
	// Pauses: inside their bursts, past the idle timeout, in about one burst
	// in three, and nothing else of the schedule changes with them. Idle
	// kills: in about two paused bursts in five (half, less those whose own
	// fault takes the only instance running) and in no other phase, of a
	// running instance that the phase's own fault leaves alone, 150-850 ms
	// past the pause's start + the idle timeout and before the burst goes
	// on, restarted within 1.5 s.
	pauseOnly := pt
	pauseOnly.pauses = true
	pp := pauseOnly
	pp.idleKills = true
	bursts, paused, idleKills := 0, 0, 0
	for seed := uint64(1); seed <= 200; seed++ {
		a, b := makeSchedule(seed, 3*time.Minute, pp), makeSchedule(seed, 3*time.Minute, pt)
		if len(a.Phases) != len(b.Phases) {
			t.Fatalf("seed %d: %d phases with pauses, %d without", seed, len(a.Phases), len(b.Phases))
		}
		running := 1
		for i, p := range a.Phases {
			if p.Records > 0 {
				bursts++
			}
			if p.Pause > 0 {
				paused++
				if p.Records == 0 || p.PauseAt <= 0 || p.PauseAt >= p.Length || p.Pause <= pt.idle {
					t.Fatalf("seed %d phase %d: %s: want a pause inside a burst, past the idle timeout %s", seed, i, p, pt.idle)
				}
			}
			if p.IdleKill {
				idleKills++
				if p.Pause == 0 {
					t.Fatalf("seed %d phase %d: %s: an idle kill without a pause", seed, i, p)
				}
				if p.IdleKillAfter < 150*time.Millisecond || p.IdleKillAfter > 850*time.Millisecond || pt.idle+p.IdleKillAfter >= p.Pause ||
					p.IdleKillDur < 0 || p.IdleKillDur > 1500*time.Millisecond {
					t.Fatalf("seed %d phase %d: %s: want the kill 150-850 ms past the idle timeout, before the burst goes on, restarted within 1.5 s", seed, i, p)
				}
				if p.IdleKillSlot < 0 || p.IdleKillSlot >= running {
					t.Fatalf("seed %d phase %d: %s: idle kill of instance %d with %d running", seed, i, p, p.IdleKillSlot, running)
				}
				switch p.Fault {
				case faultScaleUp, faultScaleDown:
					if p.IdleKillSlot != 0 {
						t.Fatalf("seed %d phase %d: %s: an idle kill of instance %d while the group scales", seed, i, p, p.IdleKillSlot)
					}
				case faultKill, faultFreeze, faultNetCut, faultRegistry:
					if p.IdleKillSlot == p.Slot {
						t.Fatalf("seed %d phase %d: %s: an idle kill of the instance of the phase's own fault", seed, i, p)
					}
				}
			}
			switch p.Fault {
			case faultScaleUp:
				running = 3
			case faultScaleDown:
				running = 1
			}
			p.PauseAt, p.Pause = 0, 0
			p.IdleKill, p.IdleKillSlot, p.IdleKillAfter, p.IdleKillDur = false, 0, 0, 0
			if p != b.Phases[i] {
				t.Fatalf("seed %d phase %d: %s with pauses, %s without", seed, i, p, b.Phases[i])
			}
		}
		// Without idle kills, the same schedule but for them.
		c := makeSchedule(seed, 3*time.Minute, pauseOnly)
		for i, p := range a.Phases {
			p.IdleKill, p.IdleKillSlot, p.IdleKillAfter, p.IdleKillDur = false, 0, 0, 0
			if p != c.Phases[i] {
				t.Fatalf("seed %d phase %d: %s with idle kills, %s without", seed, i, a.Phases[i], c.Phases[i])
			}
		}
		if slices.ContainsFunc(b.Phases, func(p phase) bool { return p.IdleKill }) || slices.ContainsFunc(c.Phases, func(p phase) bool { return p.IdleKill }) {
			t.Fatalf("seed %d: an idle kill in a schedule without them", seed)
		}
	}
	if paused*5 < bursts || paused*2 > bursts {
		t.Errorf("%d of %d bursts paused, want about a third", paused, bursts)
	}
	if idleKills*4 < paused || idleKills*3 > paused*2 {
		t.Errorf("%d of %d paused bursts with an idle kill, want about half", idleKills, paused)
	}
	// A cluster: every round freezes one node past its session with the
	// controller, every broker restart kills one or two existing nodes (two in
	// about a third of them), every other round restarts them all in turn. (Its draws come from a source of their own, so a
	// single broker's schedules are what they were before clusters.)
	cp := pt
	cp.nodes, cp.nodeSession = 3, 9*time.Second
	restarts, doubles, cuts, partial := 0, 0, 0, 0
	for seed := uint64(1); seed <= 200; seed++ {
		c := makeSchedule(seed, 3*time.Minute, cp)
		freezes, brokers, rolling := 0, 0, 0
		for i, p := range c.Phases {
			switch p.Fault {
			case faultRolling:
				rolling++
				if n := p.Nodes.list(); len(n) != 1 || n[0] >= cp.nodes {
					t.Fatalf("seed %d phase %d: %s: want the node to begin with", seed, i, p)
				}
			case faultNodeFreeze:
				freezes++
				if n := p.Nodes.list(); len(n) != 1 || n[0] >= cp.nodes || p.Dur <= cp.nodeSession || p.At > p.Length/2 {
					t.Fatalf("seed %d phase %d: %s: want one node frozen past %s in the first half of its phase", seed, i, p, cp.nodeSession)
				}
			case faultBroker:
				brokers++
				n := p.Nodes.list()
				if len(n) < 1 || len(n) > 2 || n[len(n)-1] >= cp.nodes {
					t.Fatalf("seed %d phase %d: %s: want one or two of %d nodes", seed, i, p, cp.nodes)
				}
				restarts++
				if len(n) == 2 {
					doubles++
				}
			case faultNetCut:
				cuts++
				if n := p.Nodes.list(); len(n) > 1 || len(n) == 1 && n[0] >= cp.nodes {
					t.Fatalf("seed %d phase %d: %s: want a cut from every node or from one", seed, i, p)
				} else if len(n) == 1 {
					partial++
				}
			default:
				if p.Nodes != 0 {
					t.Fatalf("seed %d phase %d: %s names nodes", seed, i, p)
				}
			}
		}
		if freezes == 0 || freezes != brokers || rolling != freezes/2 {
			t.Fatalf("seed %d: %d node freezes, %d broker restarts and %d rolling restarts, want one of the first two per round and a rolling restart every other round", seed, freezes, brokers, rolling)
		}
	}
	if doubles*5 < restarts || doubles*2 > restarts {
		t.Errorf("%d of %d broker restarts killed two nodes, want about a third", doubles, restarts)
	}
	if partial*3 < cuts || partial*3 > 2*cuts {
		t.Errorf("%d of %d network cuts on a cluster were from one node only, want about half", partial, cuts)
	}
	// The late policy: apply in about half the runs that may use it, never
	// in the others, and the rest of a seed's schedule the same either way.
	lp := pt
	lp.lateApply = true
	applied := 0
	for seed := uint64(1); seed <= 200; seed++ {
		a, b := makeSchedule(seed, 3*time.Minute, lp), makeSchedule(seed, 3*time.Minute, pt)
		if b.Late != "dlq" {
			t.Fatalf("seed %d: --late=%s where apply is not allowed", seed, b.Late)
		}
		if a.Late == "apply" {
			applied++
		} else if a.Late != "dlq" {
			t.Fatalf("seed %d: --late=%q", seed, a.Late)
		}
		if !slices.Equal(a.Phases, b.Phases) || a.InputSeed != b.InputSeed {
			t.Fatalf("seed %d: the late policy changed the schedule:\n%s\n%s", seed, a, b)
		}
	}
	if applied < 70 || applied > 130 {
		t.Errorf("%d of 200 schedules use --late=apply, want about half", applied)
	}
	// The registry: in about half the runs that may, and then one outage a
	// round, 2-8 s, of a running instance's slot; never otherwise.
	rp := pt
	rp.registry = true
	regRuns := 0
	for seed := uint64(1); seed <= 200; seed++ {
		a := makeSchedule(seed, 3*time.Minute, rp)
		running, outages, rounds := 1, 0, 0
		for i, p := range a.Phases {
			switch p.Fault {
			case faultScaleUp:
				running = 3
			case faultScaleDown:
				running = 1
			case faultGraceful:
				rounds++
			case faultRegistry:
				outages++
				if !a.Registry || p.Slot >= running || p.Dur < 2*time.Second || p.Dur > 8*time.Second || p.At > p.Length/2 {
					t.Fatalf("seed %d phase %d: %s in a schedule with registry=%v, %d running", seed, i, p, a.Registry, running)
				}
			}
		}
		if a.Registry {
			regRuns++
			if outages != rounds {
				t.Fatalf("seed %d: %d registry outages over %d rounds", seed, outages, rounds)
			}
		}
		if b := makeSchedule(seed, 3*time.Minute, pt); b.Registry || slices.ContainsFunc(b.Phases, func(p phase) bool { return p.Fault == faultRegistry }) {
			t.Fatalf("seed %d: a registry where none may be", seed)
		}
	}
	if regRuns < 70 || regRuns > 130 {
		t.Errorf("%d of 200 schedules read through a registry, want about half", regRuns)
	}
	one := makeSchedule(1, 0, pt)
	t.Logf("a one-round schedule plans %s:\n%s", one.length(), one)
	t.Logf("a one-round schedule on a cluster of 3:\n%s", makeSchedule(1, 0, cp))
	t.Logf("a one-round schedule with pauses and idle kills:\n%s", makeSchedule(4, 0, pp))
}

// TestIdleFreezes: about one quiet phase in five (never the last) freezes an
// instance past the idle timeout, before the phase ends, for longer than the
// idle declaration's lease and 1.5 s within the session timeout, never an
// instance that its phase's or the next phase's fault touches; and the schedule
// is otherwise the one it was without them.
func TestIdleFreezes(t *testing.T) {
	pt := planTimes{session: 6 * time.Second, idle: 2 * time.Second}
	for _, base := range []planTimes{pt, {session: pt.session, idle: pt.idle, pauses: true, idleKills: true}} {
		withFreezes := base
		withFreezes.idleFreezes = true
		quiet, freezes := 0, 0
		for seed := uint64(1); seed <= 200; seed++ {
			a, b := makeSchedule(seed, 3*time.Minute, withFreezes), makeSchedule(seed, 3*time.Minute, base)
			if len(a.Phases) != len(b.Phases) {
				t.Fatalf("seed %d: %d phases with idle freezes, %d without", seed, len(a.Phases), len(b.Phases))
			}
			running := 1
			for i, p := range a.Phases {
				before := running
				switch p.Fault {
				case faultScaleUp:
					running = 3
				case faultScaleDown:
					running = 1
				}
				if p.Records == 0 && i+1 < len(a.Phases) {
					quiet++
				}
				if p.IdleFreeze {
					freezes++
					if p.Records > 0 || i+1 == len(a.Phases) {
						t.Fatalf("seed %d phase %d: %s: an idle freeze in a burst or the last phase", seed, i, p)
					}
					if p.IdleFreezeAfter < 150*time.Millisecond || pt.idle+p.IdleFreezeAfter > p.Length-100*time.Millisecond ||
						p.IdleFreezeDur < 1200*time.Millisecond || p.IdleFreezeDur > pt.session-1500*time.Millisecond {
						t.Fatalf("seed %d phase %d: %s: want the freeze 150 ms past the idle timeout, before the phase ends, 1.2 s to 1.5 s within the session", seed, i, p)
					}
					if p.IdleFreezeSlot < 0 || p.IdleFreezeSlot >= min(before, running) {
						t.Fatalf("seed %d phase %d: %s: idle freeze of instance %d with %d running", seed, i, p, p.IdleFreezeSlot, min(before, running))
					}
					for _, q := range []phase{p, a.Phases[i+1]} {
						switch q.Fault {
						case faultGraceful:
							t.Fatalf("seed %d phase %d: %s: an idle freeze beside a graceful restart", seed, i, p)
						case faultScaleUp, faultScaleDown:
							if p.IdleFreezeSlot != 0 {
								t.Fatalf("seed %d phase %d: %s: an idle freeze of instance %d while the group scales", seed, i, p, p.IdleFreezeSlot)
							}
						case faultKill, faultFreeze, faultNetCut, faultRegistry:
							if p.IdleFreezeSlot == q.Slot {
								t.Fatalf("seed %d phase %d: %s: an idle freeze of the instance of %s", seed, i, p, q)
							}
						}
					}
				}
				p.IdleFreeze, p.IdleFreezeSlot, p.IdleFreezeAfter, p.IdleFreezeDur = false, 0, 0, 0
				if p != b.Phases[i] {
					t.Fatalf("seed %d phase %d: %s with idle freezes, %s without", seed, i, a.Phases[i], b.Phases[i])
				}
			}
		}
		if freezes*8 < quiet || freezes*3 > quiet {
			t.Errorf("%d of %d quiet phases with an idle freeze, want about a fifth", freezes, quiet)
		}
	}
}
