package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// floorProc is the floor processor's name in results (it takes no options).
const floorProc = "floor"

// group is the results of one (mode, processor, entities, rate) cell over the rounds.
type group struct {
	mode, proc string
	entities   int
	rate       int
	runs       []Result
}

func (g *group) median(f func(Result) float64) float64 {
	xs := make([]float64, 0, len(g.runs))
	for _, r := range g.runs {
		xs = append(xs, f(r))
	}
	return Median(xs)
}

// steadyCores is the median busy cores of the machine during the runs' steady phases
// and the processor's, the broker's and the load generator's shares, or "—" for
// results recorded before they were measured.
func (g *group) steadyCores() string {
	if g.runs[0].Steady.Cores == 0 {
		return "—"
	}
	broker := "?"
	if b := g.median(func(r Result) float64 { return r.Steady.Broker }); b >= 0 {
		broker = fmt.Sprintf("%.2f", b)
	}
	return fmt.Sprintf("%.2f of %d (%.2f / %s / %.2f)", g.median(func(r Result) float64 { return r.Steady.Busy }), g.runs[0].Steady.Cores,
		g.median(func(r Result) float64 { return r.Steady.Processor }), broker,
		g.median(func(r Result) float64 { return r.Steady.Harness }))
}

// refFor is the "ours" processor a peer is compared with: ours with the same groups=N
// (none for the single-key contract) and the same exactly-once setting, else the
// first ours with the same groups=N. A groups run is never compared with a run of
// another number of groups: they are different work.
func refFor(peer string, procs []string) string {
	eos := strings.Contains(peer, ":eos")
	groups := groupsOf(peer)
	first := ""
	for _, p := range procs {
		if !strings.HasPrefix(p, "ours") || groupsOf(p) != groups {
			continue
		}
		if first == "" {
			first = p
		}
		if strings.Contains(p, ":eos") == eos {
			return p
		}
	}
	return first
}

// groupsOf is the groups=N of a processor spec as written, 0 without one.
func groupsOf(name string) int {
	p, err := ParseProcSpec(name)
	if err != nil {
		return 0
	}
	return p.Groups
}

// ratio is the median over rounds of ours/peer within a round, so that the noise
// a round shares (another engineer's build) mostly cancels.
func ratio(runs []Result, mode, ours, peer string, entities, rate int, f func(Result) float64) float64 {
	byRound := map[int][2]float64{}
	for _, r := range runs {
		if r.Mode != mode || r.Entities != entities || r.Rate != rate || r.Err != "" {
			continue
		}
		v := byRound[r.Round]
		if v == [2]float64{} {
			v = [2]float64{math.NaN(), math.NaN()}
		}
		switch r.Processor {
		case ours:
			v[0] = f(r)
		case peer:
			v[1] = f(r)
		}
		byRound[r.Round] = v
	}
	var xs []float64
	for _, v := range byRound {
		if !math.IsNaN(v[0]) && !math.IsNaN(v[1]) && v[1] != 0 {
			xs = append(xs, v[0]/v[1])
		}
	}
	return Median(xs)
}

// Report renders the results as Markdown tables: medians over rounds of each cell,
// and the ratio ours/peer per round, medianed, so that the noise a round shares
// with its peer mostly cancels.
func Report(all []Result) string {
	var groups []*group
	index := map[string]*group{}
	// Processors per mode: a latency peer is compared with an ours that has latency runs.
	procs := map[string][]string{}
	seenProc := map[string]bool{}
	failed := 0
	for _, r := range all {
		if r.Err != "" {
			failed++
			continue
		}
		if !seenProc[r.Mode+"|"+r.Processor] {
			seenProc[r.Mode+"|"+r.Processor] = true
			procs[r.Mode] = append(procs[r.Mode], r.Processor)
		}
		k := fmt.Sprintf("%s|%s|%d|%d", r.Mode, r.Processor, r.Entities, r.Rate)
		g := index[k]
		if g == nil {
			g = &group{mode: r.Mode, proc: r.Processor, entities: r.Entities, rate: r.Rate}
			index[k] = g
			groups = append(groups, g)
		}
		g.runs = append(g.runs, r)
	}
	var b strings.Builder
	fmtRatio := func(x float64) string {
		if math.IsNaN(x) {
			return "—"
		}
		return fmt.Sprintf("%.2f", x)
	}
	b.WriteString("Throughput (input produced first; medians over rounds):\n\n")
	// The floor columns appear when a floor ran: ours/floor per round, medianed, on
	// each ours row (the floor is the ceiling, not a peer to beat).
	hasFloor := slices.Contains(procs["throughput"], floorProc)
	b.WriteString("| processor | entities | runs | events/s | wall s (incl. startup) | startup s | peak RSS MiB | CPU s / M events | answered/inputs | ours/peer events/s | ours/peer RSS | ours/peer CPU |")
	if hasFloor {
		b.WriteString(" ours/floor events/s | ours/floor CPU |")
	}
	b.WriteString("\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
	if hasFloor {
		b.WriteString(" ---: | ---: |")
	}
	b.WriteString("\n")
	for _, g := range groups {
		if g.mode != "throughput" {
			continue
		}
		ref, rt, rr, rc := "", math.NaN(), math.NaN(), math.NaN()
		if !strings.HasPrefix(g.proc, "ours") && g.proc != floorProc {
			ref = refFor(g.proc, procs[g.mode])
			rt = ratio(all, g.mode, ref, g.proc, g.entities, g.rate, func(r Result) float64 { return r.EventsPerSec })
			rr = ratio(all, g.mode, ref, g.proc, g.entities, g.rate, func(r Result) float64 { return r.PeakRSSMiB })
			rc = ratio(all, g.mode, ref, g.proc, g.entities, g.rate, func(r Result) float64 { return r.CPUSecPerMEvt })
		}
		answered := fmt.Sprintf("%d/%d", g.runs[0].Unique, g.runs[0].Events)
		if g.runs[0].DeadLetters > 0 {
			answered += fmt.Sprintf(" (%d DLQ)", g.runs[0].DeadLetters)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %.1f | %.1f | %.0f | %.2f | %s | %s | %s | %s |",
			g.proc, g.entities, len(g.runs),
			g.median(func(r Result) float64 { return r.EventsPerSec }),
			g.median(func(r Result) float64 { return r.WallSec }),
			g.median(func(r Result) float64 { return r.StartupSec }),
			g.median(func(r Result) float64 { return r.PeakRSSMiB }),
			g.median(func(r Result) float64 { return r.CPUSecPerMEvt }),
			answered, withRef(fmtRatio(rt), ref), fmtRatio(rr), fmtRatio(rc))
		if hasFloor {
			ft, fc := math.NaN(), math.NaN()
			if strings.HasPrefix(g.proc, "ours") {
				ft = ratio(all, g.mode, g.proc, floorProc, g.entities, g.rate, func(r Result) float64 { return r.EventsPerSec })
				fc = ratio(all, g.mode, g.proc, floorProc, g.entities, g.rate, func(r Result) float64 { return r.CPUSecPerMEvt })
			}
			fmt.Fprintf(&b, " %s | %s |", fmtRatio(ft), fmtRatio(fc))
		}
		b.WriteString("\n")
	}
	writeGroupsTable(&b, all, groups)
	b.WriteString("\nLatency (event_time = produce wall time; latency = output's broker append time − event_time; medians over rounds):\n\n")
	b.WriteString("| processor | entities | rate ev/s | runs | latency samples | p50 ms | p99 ms | p999 ms | max ms | peak RSS MiB | CPU s / M events | busy cores (processor / broker / load generator) | ours/peer p99 | ours/peer RSS |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, g := range groups {
		if g.mode != "latency" {
			continue
		}
		ref, rp, rr := "", math.NaN(), math.NaN()
		if !strings.HasPrefix(g.proc, "ours") {
			ref = refFor(g.proc, procs[g.mode])
			rp = ratio(all, g.mode, ref, g.proc, g.entities, g.rate, func(r Result) float64 { return r.P99Ms })
			rr = ratio(all, g.mode, ref, g.proc, g.entities, g.rate, func(r Result) float64 { return r.PeakRSSMiB })
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.2f | %s | %s | %s |\n",
			g.proc, g.entities, g.rate, len(g.runs), g.runs[0].LatencySamples,
			g.median(func(r Result) float64 { return r.P50Ms }),
			g.median(func(r Result) float64 { return r.P99Ms }),
			g.median(func(r Result) float64 { return r.P999Ms }),
			g.median(func(r Result) float64 { return r.MaxMs }),
			g.median(func(r Result) float64 { return r.PeakRSSMiB }),
			g.median(func(r Result) float64 { return r.CPUSecPerMEvt }),
			g.steadyCores(), withRef(fmtRatio(rp), ref), fmtRatio(rr))
	}
	added := false
	for _, g := range groups {
		if g.mode != "latency" || g.runs[0].AddedBatches == 0 {
			continue
		}
		if !added {
			added = true
			b.WriteString("\nAdded latency (ours' own velocity_added_latency_seconds over the measured phase: per batch, poll to producer hand-off, without the reorder wait or the broker; medians over rounds):\n\n")
			b.WriteString("| processor | entities | rate ev/s | runs | batches | p50 ms | p99 ms |\n")
			b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.3f | %.3f |\n", g.proc, g.entities, g.rate, len(g.runs), g.runs[0].AddedBatches,
			g.median(func(r Result) float64 { return r.AddedP50Ms }), g.median(func(r Result) float64 { return r.AddedP99Ms }))
	}
	if failed > 0 {
		fmt.Fprintf(&b, "\n%d run(s) failed and are left out; see the results file.\n", failed)
	}
	return b.String()
}

func withRef(s, ref string) string {
	if ref == "" || s == "—" {
		return s
	}
	return s + " (vs " + ref + ")"
}

// withGroups is processor spec name with its groups=N option set to n (the spec of
// the same processor over fewer groups), or "" if it has none.
func withGroups(name string, n int) string {
	parts := strings.Split(name, ":")
	for i, o := range parts {
		if strings.HasPrefix(o, "groups=") {
			parts[i] = fmt.Sprintf("groups=%d", n)
			return strings.Join(parts, ":")
		}
	}
	return ""
}

// writeGroupsTable adds the groups runs' own table: rows and distinct keys per group,
// CPU per input event against the same processor with one group (per round, medianed:
// issue 27's "each added group costs ≤ 1.5× one group's per-event CPU"), and the peak
// RSS the last group added, per key of that group (against groups=N−1, per round,
// medianed; a JVM's RSS is its heap's growth, not its live state).
func writeGroupsTable(b *strings.Builder, all []Result, cells []*group) {
	header := false
	for _, g := range cells {
		if g.mode != "throughput" || g.runs[0].Groups == 0 {
			continue
		}
		if !header {
			header = true
			b.WriteString("\nGroups (throughput runs; per group in order card, device, ip):\n\n")
			b.WriteString("| processor | entities | runs | rows per group | keys per group | CPU s / M input events | CPU / groups=1 CPU | Δ peak RSS vs groups=N−1, B per key of the added group |\n")
			b.WriteString("| --- | ---: | ---: | --- | --- | ---: | ---: | ---: |\n")
		}
		r0 := g.runs[0]
		cpu1, mem := math.NaN(), math.NaN()
		if one := withGroups(g.proc, 1); r0.Groups > 1 {
			cpu1 = ratio(all, g.mode, g.proc, one, g.entities, g.rate, func(r Result) float64 { return r.CPUSecPerMEvt })
			prev := withGroups(g.proc, r0.Groups-1)
			if keys := r0.GroupKeys; len(keys) == r0.Groups && keys[r0.Groups-1] > 0 {
				d := diff(all, g.mode, g.proc, prev, g.entities, g.rate, func(r Result) float64 { return r.PeakRSSMiB })
				mem = d * (1 << 20) / float64(keys[r0.Groups-1])
			}
		}
		fmtX := func(x float64, f string) string {
			if math.IsNaN(x) {
				return "—"
			}
			return fmt.Sprintf(f, x)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %v | %v | %.2f | %s | %s |\n", g.proc, g.entities, len(g.runs), r0.GroupRows, r0.GroupKeys,
			g.median(func(r Result) float64 { return r.CPUSecPerMEvt }), fmtX(cpu1, "%.2f"), fmtX(mem, "%.0f"))
	}
}

// diff is ratio's difference: the median over rounds of a − b within a round.
func diff(runs []Result, mode, a, b string, entities, rate int, f func(Result) float64) float64 {
	byRound := map[int][2]float64{}
	for _, r := range runs {
		if r.Mode != mode || r.Entities != entities || r.Rate != rate || r.Err != "" {
			continue
		}
		v, ok := byRound[r.Round]
		if !ok {
			v = [2]float64{math.NaN(), math.NaN()}
		}
		switch r.Processor {
		case a:
			v[0] = f(r)
		case b:
			v[1] = f(r)
		}
		byRound[r.Round] = v
	}
	var xs []float64
	for _, v := range byRound {
		if !math.IsNaN(v[0]) && !math.IsNaN(v[1]) {
			xs = append(xs, v[0]-v[1])
		}
	}
	return Median(xs)
}
