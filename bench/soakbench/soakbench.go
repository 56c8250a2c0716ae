// Package soakbench runs dragon soak: one cloud and several device
// daemons, as processes on loopback, each device behind a netsim link of
// its own, asked questions without pause for a set time while the links
// change shape, stall and reset, a device is killed mid-answer, the cloud
// restarts and its KV cache's disk fails. Every greedy answer is held to
// the one the same question got before any fault: the tokens decided with
// the cloud must be the same, faults or not.
package soakbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/loadbench"
	"github.com/dragon-rag/dragon/netsim"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Start runs one daemon from its command line ("cloud ...", "device
// ..."): the dragon binary, or a test binary standing in for it.
type Start func(name string, args []string) (*aggbench.Daemon, error)

// Options configure a soak.
type Options struct {
	Start       Start
	Devices     int
	Duration    time.Duration
	Model       string // both sides' model
	CloudIndex  string
	DeviceIndex string // copied for each device, which writes its own
	Questions   []string
	MaxTokens   int
	// CloudTimeout is the devices' --cloud-timeout; the soak's long
	// stalls outlast it and its short ones do not.
	CloudTimeout time.Duration
	Seed         uint64
	Work         string // a scratch folder (the devices' indexes, the cloud's KV cache)
	Log          func(format string, args ...any)
}

// Report is what dragon soak --json prints.
type Report struct {
	Date      string         `json:"date"`
	Devices   int            `json:"devices"`
	Seconds   float64        `json:"seconds"`
	Answers   int            `json:"answers"`
	WithCloud int            `json:"with_cloud"`
	Fallback  map[string]int `json:"fallback"` // by the devices' dragon_fallbacks_total reason
	Refused   map[string]int `json:"refused"`  // answers refused, by gRPC code
	// Cut are questions a device's kill or the cloud's restart broke off
	// (the client saw the connection go, not an answer's end).
	Cut         int `json:"cut"`
	WrongTokens int `json:"wrong_tokens"`
	// LostAcks is not measured here: the soak adds no documents (bench
	// docs kills the device with acknowledged documents).
	Goroutines struct {
		Start int `json:"start"`
		End   int `json:"end"`
	} `json:"goroutines"`
	SessionsOpenAtEnd int `json:"sessions_open_at_end"`
	// CacheDiskErrors are the cloud's failed KV-cache disk writes after
	// its disk broke: each turns disk writes off for a while, so few.
	CacheDiskErrors int `json:"cache_disk_errors"`
	RSSMB           struct {
		DeviceMax float64 `json:"device_max"`
		CloudMax  float64 `json:"cloud_max"`
	} `json:"rss_mb"`
	Faults map[string]int `json:"faults"`
	// Wrong lists the answers that broke the promise, for a person.
	Wrong []string `json:"wrong,omitempty"`
}

// node is one device daemon and the link in front of the cloud.
type node struct {
	i     int
	args  []string
	link  *netsim.Link
	proxy *netsim.Proxy

	mu   sync.Mutex
	d    *aggbench.Daemon
	conn *grpc.ClientConn
	gen  dragonv1.DeviceServiceClient
	// counted holds the fallback counters of the node's earlier
	// processes (a killed device's are read before the kill).
	counted map[string]float64
	// epoch counts the node's starts; a question cut off by a kill waits
	// for the next.
	epoch int
}

// soak is one run's state.
type soak struct {
	o      Options
	rng    *rand.Rand
	cloud  *aggbench.Daemon
	cloudL string // the cloud's fixed address (a restart listens there again)
	cargs  []string
	nodes  []*node
	ref    [][]int32

	mu     sync.Mutex
	rep    Report
	rssDev []float64
	rssCld []float64
}

func (s *soak) logf(format string, args ...any) {
	if s.o.Log != nil {
		s.o.Log(format, args...)
	}
}

func (s *soak) fault(kind string) {
	s.mu.Lock()
	s.rep.Faults[kind]++
	s.mu.Unlock()
}

// Run runs the soak and reports it; an error is a soak that could not run
// (a daemon that would not start), not a broken promise, which the report
// counts.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Devices < 1 || o.Duration <= 0 || len(o.Questions) == 0 || o.Start == nil {
		return Report{}, errors.New("soak: need devices, a duration, questions and a way to start daemons")
	}
	s := &soak{o: o, rng: rand.New(rand.NewPCG(o.Seed, 58))}
	s.rep = Report{Date: time.Now().UTC().Format(time.RFC3339), Devices: o.Devices, Fallback: map[string]int{}, Refused: map[string]int{}, Faults: map[string]int{}}
	defer s.stop()
	if err := s.startAll(); err != nil {
		return s.rep, err
	}
	if err := s.reference(ctx); err != nil {
		return s.rep, err
	}
	startG := s.goroutines(ctx)
	for _, g := range startG {
		s.rep.Goroutines.Start += g
	}
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range s.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); s.ask(runCtx, n) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.chaos(runCtx) }()
	wg.Wait()
	s.rep.Seconds = time.Since(start).Seconds()
	s.calm()
	s.settle(ctx)
	s.rep.Goroutines.End = s.leftOver(ctx, startG)
	s.rep.SessionsOpenAtEnd = s.sessions(ctx)
	cloud, _ := s.daemons()
	errs, _ := metric(ctx, cloud, "dragon_kvcache_disk_errors_total")
	s.rep.CacheDiskErrors = int(errs)
	s.countFallbacks(ctx)
	s.rep.RSSMB.DeviceMax, s.rep.RSSMB.CloudMax = maxOf(s.rssDev)/(1<<20), maxOf(s.rssCld)/(1<<20)
	return s.rep, nil
}

func (s *soak) startAll() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.cloudL = port
	kv := filepath.Join(s.o.Work, "cloud-kv")
	s.cargs = []string{"cloud", "--listen", s.cloudL, "--http", "127.0.0.1:0", "--model", s.o.Model, "--threads", "1",
		"--index", s.o.CloudIndex, "--profile", "", "--rerank-model", "", "--kv-cache-dir", kv, "--kv-cache-disk-mb", "64", "--pprof"}
	if s.cloud, err = s.o.Start("cloud", s.cargs); err != nil {
		return err
	}
	for i := range s.o.Devices {
		link, err := netsim.NewLink(netsim.Shape{}, s.o.Seed+uint64(i))
		if err != nil {
			return err
		}
		p, err := netsim.NewProxy("127.0.0.1:0", s.cloudL, link, nil)
		if err != nil {
			return err
		}
		go func() { _ = p.Serve(context.Background()) }()
		index := filepath.Join(s.o.Work, fmt.Sprintf("device-%d", i))
		if err := os.CopyFS(index, os.DirFS(s.o.DeviceIndex)); err != nil {
			_ = p.Close()
			return fmt.Errorf("copy the device index: %w", err)
		}
		n := &node{i: i, link: link, proxy: p, counted: map[string]float64{}, args: []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
			"--model", s.o.Model, "--threads", "1", "--index", index, "--cloud", p.Addr(), "--profile", "", "--rerank-model", "",
			"--cloud-timeout", s.o.CloudTimeout.String(), "--pprof"}}
		if err := s.startNode(n); err != nil {
			_ = p.Close()
			return err
		}
		s.nodes = append(s.nodes, n)
	}
	return nil
}

func (s *soak) startNode(n *node) error {
	d, err := s.o.Start(fmt.Sprintf("device %d", n.i), n.args)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(d.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		d.Kill()
		return err
	}
	for d.HTTPAddr() == "" {
		time.Sleep(10 * time.Millisecond)
	}
	n.mu.Lock()
	n.d, n.conn, n.gen = d, conn, dragonv1.NewDeviceServiceClient(conn)
	n.epoch++
	n.mu.Unlock()
	return nil
}

func (s *soak) stop() {
	for _, n := range s.nodes {
		n.mu.Lock()
		if n.conn != nil {
			n.conn.Close()
		}
		if n.d != nil {
			_ = n.d.Stop(30 * time.Second)
		}
		n.mu.Unlock()
		_ = n.proxy.Close()
	}
	if s.cloud != nil {
		_ = s.cloud.Stop(30 * time.Second)
	}
}

func (s *soak) request(q string) *dragonv1.GenerateRequest {
	return &dragonv1.GenerateRequest{Prompt: q, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION,
		Sampling: &dragonv1.SamplingParams{MaxTokens: uint32(s.o.MaxTokens)}}
}

// reference asks every question once over a clean link: the answers the
// faults must not change.
func (s *soak) reference(ctx context.Context) error {
	n := s.nodes[0]
	for _, q := range s.o.Questions {
		a, err := aggbench.Ask(ctx, n.gen, s.request(q))
		if err != nil {
			return fmt.Errorf("soak: the fault-free answer to %q: %w", q, err)
		}
		if a.Summary.GetFallback() {
			return fmt.Errorf("soak: the fault-free answer to %q fell back: %s", q, a.Summary.GetFallbackReason())
		}
		s.ref = append(s.ref, a.Tokens)
	}
	// The other devices answer the first question too: the same tokens,
	// and each holds its connection to the cloud before its goroutines
	// are counted.
	for _, n := range s.nodes[1:] {
		a, err := aggbench.Ask(ctx, n.gen, s.request(s.o.Questions[0]))
		if err != nil {
			return fmt.Errorf("soak: device %d's fault-free answer: %w", n.i, err)
		}
		if !slices.Equal(a.Tokens, s.ref[0]) {
			return fmt.Errorf("soak: device %d answered %v over a clean link, device 0 %v", n.i, a.Tokens, s.ref[0])
		}
	}
	s.logf("soak: %d fault-free answers", len(s.ref))
	return nil
}

// ask asks node n's device questions until ctx ends, checking each answer.
func (s *soak) ask(ctx context.Context, n *node) {
	for k := n.i; ctx.Err() == nil; k++ {
		qi := k % len(s.o.Questions)
		n.mu.Lock()
		gen, epoch := n.gen, n.epoch
		n.mu.Unlock()
		a, err := aggbench.Ask(context.WithoutCancel(ctx), gen, s.request(s.o.Questions[qi]))
		if s.record(n, qi, a, err) {
			s.awaitRestart(ctx, n, epoch)
		}
	}
}

// awaitRestart waits until node n has been started again after epoch.
func (s *soak) awaitRestart(ctx context.Context, n *node, epoch int) {
	for ctx.Err() == nil {
		n.mu.Lock()
		again := n.epoch > epoch
		n.mu.Unlock()
		if again {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// record classifies one answer and holds it to the reference; it reports
// whether the question was cut off.
func (s *soak) record(n *node, qi int, a aggbench.Answer, err error) (wasCut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if st, ok := status.FromError(err); ok && !cut(err) {
			s.rep.Refused[st.Code().String()]++
			return false
		}
		s.rep.Cut++
		return true
	}
	s.rep.Answers++
	ref, sum := s.ref[qi], a.Summary
	upTo := len(a.Tokens)
	if sum.GetFallback() {
		upTo = min(int(sum.GetFallbackStep()), upTo)
	} else {
		s.rep.WithCloud++
	}
	// Tokens decided with the cloud are the fault-free answer's; after a
	// fallback the device decides alone, and may differ.
	if upTo > len(ref) || !slices.Equal(a.Tokens[:upTo], ref[:upTo]) || (!sum.GetFallback() && len(a.Tokens) != len(ref)) {
		s.rep.WrongTokens++
		s.rep.Wrong = append(s.rep.Wrong, fmt.Sprintf("device %d, question %d: %v (fallback %v at step %d: %s), fault-free %v",
			n.i, qi, a.Tokens, sum.GetFallback(), sum.GetFallbackStep(), sum.GetFallbackReason(), ref))
	}
	return false
}

// cut says whether err is the client's connection to a device going
// (the device killed), rather than a status the device chose.
func cut(err error) bool {
	st, _ := status.FromError(err)
	msg := st.Message()
	return strings.Contains(msg, "connection") || strings.Contains(msg, "EOF") || strings.Contains(msg, "transport")
}

// chaos changes the links' shapes every few seconds and, once each, kills
// a device mid-answer, restarts the cloud and breaks the cloud's KV-cache
// disk, sampling the daemons' RSS as it goes.
func (s *soak) chaos(ctx context.Context) {
	// The disk breaks after the cloud's restart, which would otherwise
	// find a file where its cache folder must be.
	once := map[string]time.Duration{"kill_device": s.o.Duration / 4, "restart_cloud": s.o.Duration / 3, "cloud_disk": s.o.Duration / 2}
	start := time.Now()
	tick := time.NewTicker(1500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.sampleRSS(ctx)
		for kind, at := range once {
			if time.Since(start) >= at {
				delete(once, kind)
				s.once(ctx, kind)
			}
		}
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		s.shake(n)
	}
}

// shake gives node n's link a new shape, or resets its connections.
func (s *soak) shake(n *node) {
	lat := time.Duration(s.rng.IntN(300)) * time.Millisecond
	shape := netsim.Shape{Latency: lat, Jitter: lat / 5, Dist: netsim.Normal}
	kind := "latency"
	switch s.rng.IntN(6) {
	case 0:
		kind, shape.StallProb, shape.StallFor = "stall_short", 0.05, s.o.CloudTimeout/4
	case 1:
		kind, shape.StallProb, shape.StallFor = "stall_long", 0.02, s.o.CloudTimeout*3/2
	case 2:
		kind, shape.Rate = "bandwidth_drop", netsim.Rate(32<<10)
	case 3:
		s.fault("reset")
		n.proxy.Reset()
		return
	}
	if err := n.link.Up.SetShape(shape); err == nil {
		_ = n.link.Down.SetShape(shape)
		s.fault(kind)
	}
}

func (s *soak) once(ctx context.Context, kind string) {
	switch kind {
	case "kill_device":
		n := s.nodes[len(s.nodes)-1]
		s.readCounters(ctx, n)
		n.mu.Lock()
		d := n.d
		n.mu.Unlock()
		_ = d.Kill()
		n.mu.Lock()
		n.conn.Close()
		n.mu.Unlock()
		s.fault(kind)
		s.logf("soak: killed device %d", n.i)
		if err := s.startNode(n); err != nil {
			s.logf("soak: device %d did not restart: %v", n.i, err)
		}
	case "restart_cloud":
		_ = s.cloud.Stop(30 * time.Second)
		s.fault(kind)
		c, err := s.o.Start("cloud", s.cargs)
		if err != nil {
			s.logf("soak: the cloud did not restart: %v", err)
			return
		}
		s.mu.Lock()
		s.cloud = c
		s.mu.Unlock()
		s.logf("soak: restarted the cloud")
	case "cloud_disk":
		// A file where the cache's folder was: every write fails, as on
		// a disk that is full or gone.
		kv := filepath.Join(s.o.Work, "cloud-kv")
		if err := os.RemoveAll(kv); err == nil && os.WriteFile(kv, []byte("not a folder"), 0o644) == nil {
			s.fault(kind)
			s.logf("soak: broke the cloud's KV-cache disk")
			s.probeCache(ctx)
		}
	}
}

// calm gives every link a clean shape again.
func (s *soak) calm() {
	for _, n := range s.nodes {
		_ = n.link.Up.SetShape(netsim.Shape{})
		_ = n.link.Down.SetShape(netsim.Shape{})
	}
}

// daemons are the HTTP addresses of the cloud and the devices now.
func (s *soak) daemons() (cloud string, devices []string) {
	s.mu.Lock()
	cloud = s.cloud.HTTPAddr()
	s.mu.Unlock()
	for _, n := range s.nodes {
		n.mu.Lock()
		devices = append(devices, n.d.HTTPAddr())
		n.mu.Unlock()
	}
	return cloud, devices
}

func (s *soak) sampleRSS(ctx context.Context) {
	cloud, devices := s.daemons()
	if v, err := metric(ctx, cloud, "dragon_resident_memory_bytes"); err == nil {
		s.mu.Lock()
		s.rssCld = append(s.rssCld, v)
		s.mu.Unlock()
	}
	for _, d := range devices {
		if v, err := metric(ctx, d, "dragon_resident_memory_bytes"); err == nil {
			s.mu.Lock()
			s.rssDev = append(s.rssDev, v)
			s.mu.Unlock()
		}
	}
}

// settle waits (up to 30 s) until no daemon has a session open.
func (s *soak) settle(ctx context.Context) {
	deadline := time.Now().Add(30 * time.Second)
	for s.sessions(ctx) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
}

// goroutines are each daemon's goroutines, by name, logged: the total of
// its goroutine profile, one snapshot (go_goroutines, read while the
// metrics handler and its collectors run, came out up to 2 over it).
func (s *soak) goroutines(ctx context.Context) map[string]int {
	out := map[string]int{}
	var each []string
	for i := range 1 + len(s.nodes) {
		name := "cloud"
		if i > 0 {
			name = fmt.Sprintf("device %d", i-1)
		}
		var v int
		if _, err := fmt.Sscanf(s.dump(ctx, name), "goroutine profile: total %d", &v); err != nil {
			s.logf("soak: %s's goroutines: %v", name, err)
		}
		out[name] = v
		each = append(each, fmt.Sprintf("%s %d", name, v))
	}
	s.logf("soak: goroutines: %s", strings.Join(each, ", "))
	return out
}

// leftOver waits (up to 15 s: streams and their connections wind down
// after the last answer) until no daemon has more goroutines than at the
// start, and returns their sum then. A daemon still over logs its
// goroutine dump, for the person who reads the report.
func (s *soak) leftOver(ctx context.Context, start map[string]int) int {
	deadline := time.Now().Add(15 * time.Second)
	for {
		now, over := s.goroutines(ctx), []string{}
		total := 0
		for name, g := range now {
			total += g
			if g > start[name] {
				over = append(over, name)
			}
		}
		if len(over) == 0 || time.Now().After(deadline) {
			for _, name := range over {
				s.logf("soak: %s has %d goroutines, %d at the start:\n%s", name, now[name], start[name], s.dump(ctx, name))
			}
			return total
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// dump is a daemon's goroutines (/debug/pprof/goroutine?debug=1).
func (s *soak) dump(ctx context.Context, name string) string {
	cloud, devices := s.daemons()
	addr := cloud
	var i int
	if _, err := fmt.Sscanf(name, "device %d", &i); err == nil {
		addr = devices[i]
	}
	body, err := get(ctx, "http://"+addr+"/debug/pprof/goroutine?debug=1")
	if err != nil {
		return err.Error()
	}
	return body
}

// probeCache asks questions the cloud has not cached until it has tried,
// and failed, to write one to its broken disk (a few tries: a session cut
// by the link's faults may end before its entries are put).
func (s *soak) probeCache(ctx context.Context) {
	cloud, _ := s.daemons()
	n := s.nodes[0]
	for try := range 5 {
		if v, _ := metric(ctx, cloud, "dragon_kvcache_disk_errors_total"); v > 0 {
			return
		}
		n.mu.Lock()
		gen := n.gen
		n.mu.Unlock()
		q := fmt.Sprintf("%s (asked again, %d)", s.o.Questions[try%len(s.o.Questions)], try)
		_, _ = aggbench.Ask(ctx, gen, s.request(q))
	}
}

// sessions sums the daemons' open generations (dragon_sessions).
func (s *soak) sessions(ctx context.Context) int {
	return int(s.sum(ctx, "dragon_sessions"))
}

func (s *soak) sum(ctx context.Context, name string) float64 {
	cloud, devices := s.daemons()
	var total float64
	for _, a := range append(devices, cloud) {
		v, _ := metric(ctx, a, name)
		total += v
	}
	return total
}

// readCounters adds node n's fallback counters to what it counted before.
func (s *soak) readCounters(ctx context.Context, n *node) {
	n.mu.Lock()
	addr := n.d.HTTPAddr()
	n.mu.Unlock()
	body, err := scrape(ctx, addr)
	if err != nil {
		return
	}
	samples, err := loadbench.ParseMetrics(body, []string{"dragon_fallbacks_total"})
	if err != nil {
		return
	}
	for sample, v := range samples {
		// dragon_fallbacks_total{reason="busy"}
		_, reason, _ := strings.Cut(sample, `reason="`)
		n.counted[strings.TrimSuffix(reason, `"}`)] += v
	}
}

// countFallbacks sums the devices' fallback counters by reason.
func (s *soak) countFallbacks(ctx context.Context) {
	for _, n := range s.nodes {
		s.readCounters(ctx, n)
		for reason, v := range n.counted {
			s.rep.Fallback[reason] += int(v)
		}
	}
}

// scraper keeps no connection open between scrapes: an idle one is a
// goroutine in the daemon, and the goroutines counted before and after
// the soak must be the daemon's own.
var scraper = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}

func scrape(ctx context.Context, addr string) (string, error) {
	if addr == "" {
		return "", errors.New("no HTTP address")
	}
	return get(ctx, "http://"+addr+"/metrics")
}

func get(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := scraper.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func metric(ctx context.Context, addr, name string) (float64, error) {
	body, err := scrape(ctx, addr)
	if err != nil {
		return 0, err
	}
	m, err := loadbench.ParseMetrics(body, []string{name})
	if err != nil {
		return 0, err
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("no %s", name)
	}
	return v, nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}
