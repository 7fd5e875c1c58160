package main

// velocity-bench api: the query API under load while the service ingests (issue 23,
// BENCHMARKS.md "Query API").
//
// One invocation, on a loopback broker:
//
//  1. peak: a fresh input of --events produced first, our binary started, the time
//     until every input has its output gives the peak ingestion rate (as compare does);
//  2. a fresh input paced at --ingest-fraction (default ½) of that peak for
//     2 × --phase, our binary serving the API on loopback: the first phase without
//     lookups, the second with a separate load generator process (velocity-bench
//     apiload, this binary) sending --lookup-rate GETs/s open-loop over keep-alive
//     connections. Each phase's ingestion throughput is the outputs appended per
//     second between its 5th second and its end (the broker's end offsets), so the
//     two are measured in the same run, on the same process, at the same input rate.
//
// The load generator reports lookups/s, status counts and latency percentiles,
// measured from each request's scheduled send time (open loop: a slow answer delays
// the ones behind it, and that wait is counted). With --batch N it sends POST
// /v1/velocity:batch of N ids instead of single GETs, at --lookup-rate/N requests per
// second, and lookups/s counts entities.
//
// Each phase also reports where the machine's CPU went (cores: the whole machine, our
// binary, this process's producer, the load generator, the broker named by
// --broker-pid or $KAFKA_LOCAL_STATE/kafka.pid): the two cores are shared by all of
// them, and a run starved of CPU shows it there. --profile saves CPU profiles of the
// second phase (our binary's through its --pprof, and the load generator's).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func init() {
	commands["api"] = cmdAPI
	commands["apiload"] = cmdAPILoad
}

// loadReport is what apiload prints, one JSON line.
type loadReport struct {
	Sent    int     `json:"sent"`
	Seconds float64 `json:"seconds"`
	PerSec  float64 `json:"per_sec"` // requests answered (any status) per second
	// Batch is the entities per request (1: single GETs; more: batch POSTs), and
	// LookupsPerSec the entities answered with 200 per second.
	Batch         int            `json:"batch"`
	LookupsPerSec float64        `json:"lookups_per_sec"`
	Statuses      map[string]int `json:"statuses"`
	P50Ms         float64        `json:"p50_ms"`
	P99Ms         float64        `json:"p99_ms"`
	P999Ms        float64        `json:"p999_ms"`
	MaxMs         float64        `json:"max_ms"`
	Late          int            `json:"behind_schedule"` // requests sent more than 1 ms after their slot
	// SvcP50Ms, SvcP99Ms: from the request's write to its answer, without the wait
	// for a free connection (the closed-loop view; the fields above are open-loop).
	SvcP50Ms float64 `json:"service_p50_ms"`
	SvcP99Ms float64 `json:"service_p99_ms"`
}

// rawConn is one keep-alive HTTP/1.1 connection with one request in flight.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(host string) (*rawConn, error) {
	c, err := net.DialTimeout("tcp", host, time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, r: bufio.NewReaderSize(c, 8192)}, nil
}

func (c *rawConn) close() { _ = c.c.Close() }

// do writes req and reads the response, returning its status; the body is discarded.
func (c *rawConn) do(req []byte) (int, error) {
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write(req); err != nil {
		return 0, err
	}
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 {
		return 0, fmt.Errorf("short status line %q", line)
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, err
	}
	length, chunked := -1, false
	for {
		h, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(h) <= 2 {
			break
		}
		if k, v, ok := bytes.Cut(bytes.TrimSpace(h), []byte(":")); ok {
			switch {
			case bytes.EqualFold(k, []byte("Content-Length")):
				length, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = true
			}
		}
	}
	switch {
	case length >= 0:
		_, err = c.r.Discard(length)
	case chunked:
		for {
			h, err := c.r.ReadSlice('\n')
			if err != nil {
				return 0, err
			}
			n, err := strconv.ParseInt(string(bytes.TrimSpace(h)), 16, 64)
			if err != nil {
				return 0, err
			}
			if _, err := c.r.Discard(int(n) + 2); err != nil {
				return 0, err
			}
			if n == 0 {
				break
			}
		}
	default:
		return 0, errors.New("response without a length")
	}
	return status, err
}

func cmdAPILoad(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("apiload", flag.ContinueOnError)
	base := fs.String("url", "", "base URL of the query API")
	rate := fs.Int("rate", 20000, "lookups (entities) per second, open loop: requests per second are rate/batch")
	batch := fs.Int("batch", 1, "entities per request: 1 sends GET …/velocity, more send POST /v1/velocity:batch with that many ids")
	d := fs.Duration("duration", 20*time.Second, "how long to send")
	entities := fs.Int("entities", 100000, "entity ids card-0000000 … are drawn uniformly from this many")
	conns := fs.Int("conns", 64, "concurrent connections (workers)")
	cpuProfile := fs.String("cpuprofile", "", "write this process's CPU profile here")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *base == "" || *rate <= 0 || *conns <= 0 || *batch <= 0 || *batch > 1000 {
		return errors.New("apiload: --url, a positive --rate and --conns, and --batch from 1 to 1000 are required")
	}
	reqRate := max(1, *rate / *batch)
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}
	u, err := url.Parse(*base)
	if err != nil || u.Scheme != "http" {
		return fmt.Errorf("apiload: --url %q: want http://host:port", *base)
	}
	// Prebuilt requests over raw keep-alive connections (rawConn): net/http's client
	// cost about as much CPU per request as the server did, on the same two cores.
	reqs := make([][]byte, 4096)
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range reqs {
		if *batch == 1 {
			reqs[i] = []byte("GET /v1/entities/" + EntityID(uint32(rng.IntN(*entities))) + "/velocity HTTP/1.1\r\nHost: " + u.Host + "\r\n\r\n")
			continue
		}
		ids := make([]string, *batch)
		for j := range ids {
			ids[j] = EntityID(uint32(rng.IntN(*entities)))
		}
		body, _ := json.Marshal(map[string][]string{"entity_ids": ids})
		reqs[i] = []byte("POST /v1/velocity:batch HTTP/1.1\r\nHost: " + u.Host + "\r\nContent-Type: application/json\r\nContent-Length: " +
			strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
	}
	type slot struct {
		at time.Time
		i  int
	}
	work := make(chan slot, reqRate) // a second of backlog at most; beyond, sends fall behind
	var (
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, reqRate*int(d.Seconds()+1))
		svc      = make([]time.Duration, 0, reqRate*int(d.Seconds()+1))
		statuses = map[string]int{}
		behind   atomic.Int64
	)
	var wg sync.WaitGroup
	for range *conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *rawConn
			for s := range work {
				if time.Since(s.at) > time.Millisecond {
					behind.Add(1)
				}
				code := "error"
				t0 := time.Now()
				if c == nil {
					c, _ = dialRaw(u.Host)
				}
				if c != nil {
					st, err := c.do(reqs[s.i&4095])
					if err != nil {
						c.close()
						c = nil
					} else {
						code = strconv.Itoa(st)
					}
				}
				now := time.Now()
				mu.Lock()
				lat = append(lat, now.Sub(s.at))
				svc = append(svc, now.Sub(t0))
				statuses[code]++
				mu.Unlock()
			}
			if c != nil {
				c.close()
			}
		}()
	}
	start := time.Now()
	sent := 0
	tick := time.NewTicker(time.Millisecond)
loop:
	for {
		el := time.Since(start)
		if el >= *d {
			break
		}
		due := int(el.Seconds() * float64(reqRate))
		for ; sent < due; sent++ {
			at := start.Add(time.Duration(float64(sent) / float64(reqRate) * float64(time.Second)))
			select {
			case work <- slot{at, sent}:
			case <-ctx.Done():
				break loop
			}
		}
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
	}
	tick.Stop()
	close(work)
	wg.Wait()
	el := time.Since(start).Seconds()
	slices.Sort(lat)
	slices.Sort(svc)
	qs := func(xs []time.Duration, f float64) float64 {
		if len(xs) == 0 {
			return 0
		}
		return float64(xs[min(len(xs)-1, int(f*float64(len(xs))))]) / 1e6
	}
	q := func(f float64) float64 { return qs(lat, f) }
	rep := loadReport{Sent: sent, Seconds: el, PerSec: float64(len(lat)) / el, Statuses: statuses,
		Batch: *batch, LookupsPerSec: float64(statuses["200"]**batch) / el,
		P50Ms: q(0.50), P99Ms: q(0.99), P999Ms: q(0.999), MaxMs: q(1), Late: int(behind.Load()),
		SvcP50Ms: qs(svc, 0.5), SvcP99Ms: qs(svc, 0.99)}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

func cmdAPI(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("api", flag.ContinueOnError)
	brokers := fs.String("brokers", "127.0.0.1:9092", "loopback Kafka broker")
	vc := fs.String("vc", "bin/velocity-consumer", "velocity-consumer binary")
	events := fs.Int("events", 1_000_000, "events of the peak run")
	entities := fs.Int("entities", 100_000, "entities")
	partitions := fs.Int("partitions", 4, "input partitions")
	fraction := fs.Float64("ingest-fraction", 0.5, "paced ingestion rate as a fraction of the measured peak")
	fixedRate := fs.Int("ingest-rate", 0, "paced ingestion rate (skips the peak run when set)")
	lookupRate := fs.Int("lookup-rate", 20000, "lookups (entities) per second of the load generator")
	batch := fs.Int("batch", 1, "entities per request of the load generator (1: single GETs; more: batch POSTs)")
	conns := fs.Int("conns", 64, "load generator connections")
	phase := fs.Duration("phase", 25*time.Second, "length of each phase (without, then with lookups)")
	workdir := fs.String("workdir", "bin/bench-api", "scratch directory (processor logs)")
	profile := fs.Bool("profile", false, "write CPU profiles of the second phase to --workdir: our binary's (service.prof, 10 s from its 5th second) and the load generator's (apiload.prof)")
	brokerPID := fs.Int("broker-pid", 0, "the broker's process id, for its CPU (default: $KAFKA_LOCAL_STATE/kafka.pid, as scripts/kafka-local.sh writes it; none: not reported)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *brokerPID == 0 {
		*brokerPID = localBrokerPID()
	}
	bs := splitList(*brokers)
	if err := checkLoopback(bs); err != nil {
		return err
	}
	if err := os.MkdirAll(*workdir, 0o755); err != nil {
		return err
	}
	adm, admCl, err := newAdmin(bs)
	if err != nil {
		return err
	}
	defer admCl.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	env := procEnv{Brokers: *brokers, VC: *vc, IdleTimeout: 200 * time.Millisecond, Checkpoint: "file"}
	spec := ProcSpec{Kind: "ours", Name: "ours"}
	stamp := strconv.FormatInt(time.Now().UnixNano(), 36)
	topics := func(tag string) (string, string, string, string) {
		return "api-" + tag + "-in-" + stamp, "api-" + tag + "-out-" + stamp, "api-" + tag + "-dlq-" + stamp, "api-" + tag + "-g-" + stamp
	}
	rate := *fixedRate
	if rate == 0 {
		// 1. Peak.
		in, out, dlq, group := topics("peak")
		if err := createTopics(ctx, adm, int32(*partitions), nil, in, out, dlq); err != nil {
			return err
		}
		defer func() { _ = deleteTopics(context.Background(), adm, in, out, dlq) }()
		w := DefaultWorkload(*entities, *events)
		if _, err := produceAll(ctx, bs, in, w); err != nil {
			return err
		}
		dir := filepath.Join(*workdir, "peak")
		_ = os.MkdirAll(dir, 0o755)
		cmd, err := env.command(spec, in, out, dlq, group, dir)
		if err != nil {
			return err
		}
		start := time.Now()
		c, err := startChild(cmd)
		if err != nil {
			return err
		}
		var first time.Time
		for {
			n, err := endOffsetSum(ctx, adm, out, dlq)
			if err != nil {
				c.stop(10 * time.Second)
				return err
			}
			if n > 0 && first.IsZero() {
				first = time.Now()
			}
			if n >= int64(*events) {
				break
			}
			if time.Since(start) > 5*time.Minute {
				c.stop(10 * time.Second)
				return errors.New("peak run: outputs incomplete after 5 minutes")
			}
			time.Sleep(20 * time.Millisecond)
		}
		peak := float64(*events) / time.Since(first).Seconds()
		c.stop(30 * time.Second)
		rate = int(peak * *fraction)
		fmt.Printf("peak ingestion: %d events in %.2f s from the first output: %.0f events/s; pacing at %.0f%%: %d events/s\n",
			*events, time.Since(first).Seconds(), peak, *fraction*100, rate)
	}

	// 2. Paced ingestion, without then with lookups.
	in, out, dlq, group := topics("paced")
	if err := createTopics(ctx, adm, int32(*partitions), nil, in, out, dlq); err != nil {
		return err
	}
	defer func() { _ = deleteTopics(context.Background(), adm, in, out, dlq) }()
	port, err := freeTCPPort()
	if err != nil {
		return err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	env.VCExtra = []string{"--api-addr", "127.0.0.1:" + strconv.Itoa(port)}
	var metricsBase string
	if *profile {
		mport, err := freeTCPPort()
		if err != nil {
			return err
		}
		metricsBase = "http://127.0.0.1:" + strconv.Itoa(mport)
		env.MetricsAddr = "127.0.0.1:" + strconv.Itoa(mport)
		env.VCExtra = append(env.VCExtra, "--pprof")
	}
	dir := filepath.Join(*workdir, "paced")
	_ = os.MkdirAll(dir, 0o755)
	cmd, err := env.command(spec, in, out, dlq, group, dir)
	if err != nil {
		return err
	}
	c, err := startChild(cmd)
	if err != nil {
		return err
	}
	defer c.stop(30 * time.Second)
	cl, err := newProducer(bs, in)
	if err != nil {
		return err
	}
	defer cl.Close()
	g, err := NewGenerator(DefaultWorkload(*entities, rate*int(2*phase.Seconds()+30)))
	if err != nil {
		return err
	}
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	prodDone := make(chan error, 1)
	total := 2**phase + 5*time.Second
	go func() {
		_, err := producePaced(pctx, cl, g, rate, total, map[string]int64{})
		prodDone <- err
	}()
	loadPID := 0 // the load generator's, once started
	type mark struct {
		at  time.Time
		out int64
		cpu apiCPU // so far, each field a total of CPU seconds
	}
	sample := func() (mark, error) {
		n, err := endOffsetSum(ctx, adm, out, dlq)
		if err != nil {
			return mark{}, err
		}
		return mark{time.Now(), n, markAPICPU(c.cmd.Process.Pid, loadPID, *brokerPID)}, nil
	}
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	// Phase A: no lookups (from its 5th second).
	if err := sleep(5 * time.Second); err != nil {
		return err
	}
	a0, err := sample()
	if err != nil {
		return err
	}
	if err := sleep(*phase - 5*time.Second); err != nil {
		return err
	}
	a1, err := sample()
	if err != nil {
		return err
	}
	// Phase B: the load generator, a process of its own.
	load := exec.CommandContext(ctx, self, "apiload", "--url", base, "--rate", strconv.Itoa(*lookupRate),
		"--duration", (*phase - time.Second).String(), "--entities", strconv.Itoa(*entities), "--conns", strconv.Itoa(*conns), "--batch", strconv.Itoa(*batch))
	load.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var loadOut []byte
	loadDone := make(chan error, 1)
	stdout, err := load.StdoutPipe()
	if err != nil {
		return err
	}
	load.Stderr = os.Stderr
	if *profile {
		load.Args = append(load.Args, "--cpuprofile", filepath.Join(*workdir, "apiload.prof"))
	}
	if err := load.Start(); err != nil {
		return err
	}
	loadPID = load.Process.Pid
	go func() {
		b, _ := io.ReadAll(bufio.NewReader(stdout))
		loadOut = b
		loadDone <- load.Wait()
	}()
	if err := sleep(5 * time.Second); err != nil {
		return err
	}
	b0, err := sample()
	if err != nil {
		return err
	}
	var hist0 map[float64]float64
	if *profile {
		hist0, _ = serverLatency(ctx, metricsBase)
	}
	profDone := make(chan error, 1)
	if *profile {
		go func() {
			profDone <- fetchProfile(ctx, metricsBase, 10*time.Second, filepath.Join(*workdir, "service.prof"))
		}()
	} else {
		profDone <- nil
	}
	// b1 a second before the generator stops (it sends for phase − 1 s), so that
	// it is still there to be measured.
	if err := sleep(*phase - 7*time.Second); err != nil {
		return err
	}
	b1, err := sample()
	if err != nil {
		return err
	}
	if err := <-loadDone; err != nil {
		return fmt.Errorf("apiload: %w", err)
	}
	if err := <-prodDone; err != nil {
		return fmt.Errorf("paced produce: %w", err)
	}
	var rep loadReport
	if err := json.Unmarshal(loadOut, &rep); err != nil {
		return fmt.Errorf("apiload report %q: %w", loadOut, err)
	}
	if err := <-profDone; err != nil {
		return fmt.Errorf("service CPU profile: %w", err)
	}
	var serverHist string
	if *profile {
		if hist1, err := serverLatency(ctx, metricsBase); err == nil && hist0 != nil {
			serverHist = histShares(hist0, hist1)
		}
	}
	thr := func(a, b mark) float64 { return float64(b.out-a.out) / b.at.Sub(a.at).Seconds() }
	cpu := func(a, b mark) apiCPU { return b.cpu.since(a.cpu, b.at.Sub(a.at)) }
	ta, tb := thr(a0, a1), thr(b0, b1)
	fmt.Printf("paced input: %d events/s\n", rate)
	fmt.Printf("ingestion without lookups: %.0f outputs/s (cores: %v)\n", ta, cpu(a0, a1))
	fmt.Printf("ingestion with lookups:    %.0f outputs/s (cores: %v), %+.1f%%\n", tb, cpu(b0, b1), (tb/ta-1)*100)
	fmt.Printf("lookups: %d entities per request, %.0f answered (200) per second\n", rep.Batch, rep.LookupsPerSec)
	if serverHist != "" {
		fmt.Printf("  in our handler (velocity_api_request_seconds, the phase's middle): %s\n", serverHist)
	}
	fmt.Printf("requests: %d sent in %.1f s, %.0f answered/s, statuses %v\n  latency from the scheduled send (open loop): p50 %.2f ms p99 %.2f ms p999 %.2f ms max %.1f ms, %d sent over 1 ms behind schedule\n  latency from the write on a free connection: p50 %.2f ms p99 %.2f ms\n",
		rep.Sent, rep.Seconds, rep.PerSec, rep.Statuses, rep.P50Ms, rep.P99Ms, rep.P999Ms, rep.MaxMs, rep.Late, rep.SvcP50Ms, rep.SvcP99Ms)
	pcancel()
	return nil
}

func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// apiCPU is where the machine's CPU went during a phase of the api run, in cores (CPU
// seconds per wall second) once turned into a rate by since: the two cores are shared
// by the broker, the producer (this process), our binary and the load generator, and
// which of them is short of CPU decides what a run can show.
type apiCPU struct {
	Machine, Service, Producer, LoadGen, Broker float64
	hasLoad, hasBroker                          bool
}

// markAPICPU reads the CPU totals so far (seconds); loadPID and brokerPID 0 = none.
func markAPICPU(svcPID, loadPID, brokerPID int) apiCPU {
	secs := func(pid int) (float64, bool) {
		if pid == 0 {
			return 0, false
		}
		s, err := sampleProc(pid)
		return s.CPU.Seconds(), err == nil
	}
	var m apiCPU
	if busy, err := machineBusy(); err == nil {
		m.Machine = busy.Seconds()
	}
	m.Service, _ = secs(svcPID)
	m.Producer, _ = secs(os.Getpid())
	m.LoadGen, m.hasLoad = secs(loadPID)
	m.Broker, m.hasBroker = secs(brokerPID)
	return m
}

// since is the use between a and m over wall, in cores.
func (m apiCPU) since(a apiCPU, wall time.Duration) apiCPU {
	w := wall.Seconds()
	return apiCPU{
		Machine: (m.Machine - a.Machine) / w, Service: (m.Service - a.Service) / w,
		Producer: (m.Producer - a.Producer) / w, LoadGen: (m.LoadGen - a.LoadGen) / w,
		Broker: (m.Broker - a.Broker) / w, hasLoad: m.hasLoad, hasBroker: m.hasBroker && a.hasBroker,
	}
}

func (m apiCPU) String() string {
	opt := func(ok bool, v float64) string {
		if !ok {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return fmt.Sprintf("machine %.2f/%d, service %.2f, producer %.2f, load generator %s, broker %s",
		m.Machine, runtime.NumCPU(), m.Service, m.Producer, opt(m.hasLoad, m.LoadGen), opt(m.hasBroker, m.Broker))
}

// localBrokerPID is the pid scripts/kafka-local.sh recorded under $KAFKA_LOCAL_STATE,
// or 0. Only that broker: the machine may run other engineers' brokers too.
func localBrokerPID() int {
	dir := os.Getenv("KAFKA_LOCAL_STATE")
	if dir == "" {
		return 0
	}
	b, err := os.ReadFile(filepath.Join(dir, "kafka.pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

// fetchProfile saves a CPU profile of d from the Go profiler served at base.
func fetchProfile(ctx context.Context, base string, d time.Duration, path string) error {
	ctx, cancel := context.WithTimeout(ctx, d+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/pprof/profile?seconds="+strconv.Itoa(int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", req.URL, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// serverLatency reads the API's request-duration histogram from our binary's /metrics
// (velocity_api_request_seconds, every op together): cumulative count by bucket bound.
func serverLatency(ctx context.Context, base string) (map[float64]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[float64]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "velocity_api_request_seconds_bucket{") {
			continue
		}
		_, rest, ok := strings.Cut(line, `le="`)
		if !ok {
			continue
		}
		le, rest, ok := strings.Cut(rest, `"`)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		bound, err1 := strconv.ParseFloat(le, 64) // "+Inf" parses as +Inf
		n, err2 := strconv.ParseFloat(f[len(f)-1], 64)
		if err1 == nil && err2 == nil {
			out[bound] += n
		}
	}
	return out, sc.Err()
}

// histShares is the share of the requests between two histogram reads answered
// within each bucket bound.
func histShares(a, b map[float64]float64) string {
	var bounds []float64
	for k := range b {
		bounds = append(bounds, k)
	}
	slices.Sort(bounds)
	if len(bounds) == 0 {
		return ""
	}
	total := b[bounds[len(bounds)-1]] - a[bounds[len(bounds)-1]]
	if total <= 0 {
		return ""
	}
	var parts []string
	for _, k := range bounds {
		if k > 0.25 {
			break
		}
		parts = append(parts, fmt.Sprintf("≤%gms %.2f%%", k*1000, 100*(b[k]-a[k])/total))
	}
	return fmt.Sprintf("%.0f requests: %s", total, strings.Join(parts, ", "))
}
