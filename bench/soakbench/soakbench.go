// Package soakbench runs dragon soak: one cloud and several device
// daemons, as processes on loopback, each device behind a netsim link of
// its own, asked questions without pause for a set time while the links
// change shape, stall and reset, a device is killed mid-answer, the cloud
// restarts and its KV cache's disk fails. Every greedy answer is held to
// the one the same question got before any fault: the tokens decided with
// the cloud must be the same, faults or not.
package soakbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// Documents adds a device that answers nothing and is given documents
	// without pause, some deleted again, and is killed -9 once among
	// them: every add and delete it acknowledged must hold at the end. It
	// answers nothing because its corpus changes under it, which would
	// change the answers the others are held to.
	Documents bool
	// Backend, when set, is the network retrieval engine the cloud
	// searches (CloudIndex is then ignored): the soak puts a link in
	// front of it, slows that link and pauses the engine once.
	Backend *Backend
	Log     func(format string, args ...any)
}

// Backend is a Weaviate node holding the cloud's corpus.
type Backend struct {
	HTTP, GRPC string // the node's addresses (host:port)
	Collection string
	// Pause freezes the node (SIGSTOP), Resume lets it go on.
	Pause, Resume func() error
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
	// StallsSurvived are the devices' waits for a decided step longer
	// than half their stall timeout that still ended in one
	// (dragon_stalls_survived_total).
	StallsSurvived int `json:"stalls_survived"`
	// LostAcks are the documents device's acknowledged adds that are not
	// there at the end, or not retrieved by their own words, and its
	// acknowledged deletes that are back (Options.Documents).
	LostAcks  int `json:"lost_acks"`
	Documents struct {
		Added   int `json:"added"`
		Deleted int `json:"deleted"`
	} `json:"documents"`
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
		// GrowthAfterWarmup is the largest rise of one answering daemon
		// process's RSS (the cloud's, a device's that answers) after its
		// first WarmupS seconds, over its RSS then (0.1: 10%); a process
		// that lived no longer is left out. The documents device, whose
		// index grows with what it is given, is in GrowthByProcess only.
		GrowthAfterWarmup float64 `json:"growth_after_warmup"`
		// GrowthByProcess is each process's ("device 2#1": its start).
		GrowthByProcess map[string]float64 `json:"growth_by_process"`
		// The same, of RSS less the KV cache's memory tier
		// (dragon_kvcache_bytes{tier="memory"}), which fills up to its
		// --kv-cache-mb as questions come.
		OutsideCacheGrowth          float64            `json:"outside_cache_growth_after_warmup"`
		OutsideCacheGrowthByProcess map[string]float64 `json:"outside_cache_growth_by_process"`
		WarmupS                     float64            `json:"warmup_s"`
		Minutes                     []RSSMinute        `json:"minutes"`
	} `json:"rss_mb"`
	Faults map[string]int `json:"faults"`
	// Wrong lists the answers that broke the promise, for a person.
	Wrong []string `json:"wrong,omitempty"`
}

// RSSMinute is the largest RSS of the devices and of the cloud seen in
// one minute of the soak.
type RSSMinute struct {
	Minute    int     `json:"minute"`
	DeviceMax float64 `json:"device_max"`
	CloudMax  float64 `json:"cloud_max"`
}

// rssSample is one daemon process's RSS at a moment of the soak.
type rssSample struct {
	at      time.Duration
	process string // its name and start, "device 2#1": a restart is another process
	cloud   bool
	library bool // the documents device
	mb      float64
	cacheMB float64 // its KV cache's memory tier
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
	// library: the documents device, which answers nothing.
	library bool
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

	// backend is the links in front of Backend's HTTP and gRPC ports.
	backend        []*netsim.Link
	backendProxies []*netsim.Proxy
	// tmpfs: the cloud's KV-cache folder is a small tmpfs of its own,
	// which the disk fault fills; else the fault puts a file where the
	// folder was.
	tmpfs bool
	start time.Time

	mu         sync.Mutex
	rep        Report
	rss        []rssSample
	cloudEpoch int
	docs       documents
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
	s.docs.added = map[string]string{}
	defer s.stop()
	if err := s.startAll(); err != nil {
		return s.rep, err
	}
	if err := s.reference(ctx); err != nil {
		return s.rep, err
	}
	startG := s.goroutines(ctx)
	for _, g := range startG {
		s.rep.Goroutines.Start += g.total
	}
	s.start = time.Now()
	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	for _, n := range s.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n.library {
				s.write(runCtx, n)
			} else {
				s.ask(runCtx, n)
			}
		}()
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.chaos(runCtx) }()
	wg.Wait()
	s.rep.Seconds = time.Since(s.start).Seconds()
	s.calm()
	s.settle(ctx)
	s.rep.Goroutines.End = s.leftOver(ctx, startG)
	s.rep.SessionsOpenAtEnd = s.sessions(ctx)
	cloud, _ := s.daemons()
	errs, _ := metric(ctx, cloud, "dragon_kvcache_disk_errors_total")
	s.rep.CacheDiskErrors = int(errs)
	s.countCounters(ctx)
	if o.Documents {
		s.checkDocuments(ctx)
	}
	s.summarizeRSS()
	return s.rep, nil
}

func (s *soak) startAll() error {
	port, err := freePort()
	if err != nil {
		return err
	}
	s.cloudL = port
	index, err := s.cloudIndex()
	if err != nil {
		return err
	}
	kv := filepath.Join(s.o.Work, "cloud-kv")
	if err := os.MkdirAll(kv, 0o755); err != nil {
		return err
	}
	if err := mountTmpfs(kv, cacheDiskMB); err == nil {
		s.tmpfs = true
	} else {
		s.logf("soak: no tmpfs for the cloud's KV cache (%v): its disk fault will be a file where its folder was", err)
	}
	s.cargs = []string{"cloud", "--listen", s.cloudL, "--http", "127.0.0.1:0", "--model", s.o.Model, "--threads", "1",
		"--index", index, "--profile", "", "--rerank-model", "", "--kv-cache-dir", kv, "--kv-cache-disk-mb", strconv.Itoa(cacheDiskMB / 2), "--pprof"}
	if s.cloud, err = s.o.Start("cloud", s.cargs); err != nil {
		return err
	}
	devices := s.o.Devices
	if s.o.Documents {
		devices++
	}
	for i := range devices {
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
		n := &node{i: i, link: link, proxy: p, counted: map[string]float64{}, library: i == s.o.Devices, args: []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
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

// cacheDiskMB is the size of the cloud's KV-cache tmpfs. The cache is
// given half of it, so that it stays within the disk until the fault
// fills the rest.
const cacheDiskMB = 64

// cloudIndex is the cloud's --index: CloudIndex, or the Backend's
// collection through links the soak shapes, searched over gRPC, each
// search given half the devices' stall timeout.
func (s *soak) cloudIndex() (string, error) {
	b := s.o.Backend
	if b == nil {
		return s.o.CloudIndex, nil
	}
	var addrs []string
	for i, target := range []string{b.HTTP, b.GRPC} {
		link, err := netsim.NewLink(netsim.Shape{}, s.o.Seed+100+uint64(i))
		if err != nil {
			return "", err
		}
		p, err := netsim.NewProxy("127.0.0.1:0", target, link, nil)
		if err != nil {
			return "", err
		}
		go func() { _ = p.Serve(context.Background()) }()
		s.backendProxies = append(s.backendProxies, p)
		s.backend = append(s.backend, link)
		addrs = append(addrs, p.Addr())
	}
	return fmt.Sprintf("weaviate://%s/%s?grpc=%s&timeout=%s", addrs[0], b.Collection, addrs[1], s.o.CloudTimeout/2), nil
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
	for _, p := range s.backendProxies {
		_ = p.Close()
	}
	if s.tmpfs {
		if err := unmount(filepath.Join(s.o.Work, "cloud-kv")); err != nil {
			s.logf("soak: unmount the cloud's KV-cache tmpfs: %v", err)
		}
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
	for _, n := range s.nodes[1:s.o.Devices] {
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

// record classifies one answer and holds it to the reference of question
// qi (none for qi < 0: a question asked only under faults); it reports
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
	sum := a.Summary
	upTo := len(a.Tokens)
	if sum.GetFallback() {
		upTo = min(int(sum.GetFallbackStep()), upTo)
	} else {
		s.rep.WithCloud++
	}
	if qi < 0 {
		return false
	}
	ref := s.ref[qi]
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
// a device mid-answer and the documents device among its writes,
// restarts the cloud, fills (or breaks) the cloud's KV-cache disk and
// pauses the retrieval engine, sampling the daemons' RSS as it goes.
func (s *soak) chaos(ctx context.Context) {
	// The disk fails after the cloud's restart, which would otherwise
	// find a file where its cache folder must be.
	once := map[string]time.Duration{"kill_device": s.o.Duration / 4, "restart_cloud": s.o.Duration / 3, "cloud_disk": s.o.Duration / 2}
	if s.o.Documents {
		once["kill_documents_device"] = s.o.Duration * 3 / 5
	}
	if s.o.Backend != nil {
		once["pause_backend"] = s.o.Duration * 7 / 10
	}
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
			if time.Since(s.start) >= at {
				delete(once, kind)
				s.once(ctx, kind)
			}
		}
		n := s.nodes[s.rng.IntN(len(s.nodes))]
		s.shake(n)
		if len(s.backend) > 0 && s.rng.IntN(4) == 0 {
			s.slowBackend()
		}
	}
}

// slowBackend gives the links to the retrieval engine a latency of up to
// a quarter of a search's timeout each way, or takes it away again.
func (s *soak) slowBackend() {
	shape := netsim.Shape{}
	kind := "backend_fast"
	if s.rng.IntN(2) == 0 {
		lat := time.Duration(s.rng.Int64N(int64(s.o.CloudTimeout / 8)))
		shape, kind = netsim.Shape{Latency: lat, Jitter: lat / 5, Dist: netsim.Normal}, "backend_slow"
	}
	for _, l := range s.backend {
		_ = l.Up.SetShape(shape)
		_ = l.Down.SetShape(shape)
	}
	s.fault(kind)
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
	case "kill_device", "kill_documents_device":
		n := s.nodes[s.o.Devices-1]
		if kind == "kill_documents_device" {
			n = s.nodes[s.o.Devices]
		}
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
		s.cloudEpoch++
		s.mu.Unlock()
		s.logf("soak: restarted the cloud")
	case "cloud_disk":
		kv := filepath.Join(s.o.Work, "cloud-kv")
		if s.tmpfs {
			if err := fill(kv); err != nil {
				s.logf("soak: fill the cloud's KV-cache disk: %v", err)
				return
			}
			s.fault("cloud_disk_full")
			s.logf("soak: filled the cloud's KV-cache disk")
		} else {
			// A file where the cache's folder was: every write fails, as
			// on a disk that is gone.
			if err := os.RemoveAll(kv); err != nil || os.WriteFile(kv, []byte("not a folder"), 0o644) != nil {
				return
			}
			s.fault("cloud_disk_broken")
			s.logf("soak: broke the cloud's KV-cache disk")
		}
		s.probeCache(ctx)
	case "pause_backend":
		if err := s.o.Backend.Pause(); err != nil {
			s.logf("soak: pause the retrieval engine: %v", err)
			return
		}
		s.fault(kind)
		s.logf("soak: paused the retrieval engine")
		// Longer than a search's timeout: searches meanwhile fail.
		time.Sleep(s.o.CloudTimeout)
		if err := s.o.Backend.Resume(); err != nil {
			s.logf("soak: resume the retrieval engine: %v", err)
		}
	}
}

// calm gives every link a clean shape again.
func (s *soak) calm() {
	for _, n := range s.nodes {
		_ = n.link.Up.SetShape(netsim.Shape{})
		_ = n.link.Down.SetShape(netsim.Shape{})
	}
	for _, l := range s.backend {
		_ = l.Up.SetShape(netsim.Shape{})
		_ = l.Down.SetShape(netsim.Shape{})
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
	at := time.Since(s.start)
	s.mu.Lock()
	cloud, process := s.cloud.HTTPAddr(), fmt.Sprintf("cloud#%d", s.cloudEpoch)
	s.mu.Unlock()
	if rss, cache, err := memory(ctx, cloud); err == nil {
		s.mu.Lock()
		s.rss = append(s.rss, rssSample{at: at, process: process, cloud: true, mb: rss, cacheMB: cache})
		s.mu.Unlock()
	}
	for _, n := range s.nodes {
		n.mu.Lock()
		addr, process := n.d.HTTPAddr(), fmt.Sprintf("device %d#%d", n.i, n.epoch)
		n.mu.Unlock()
		if rss, cache, err := memory(ctx, addr); err == nil {
			s.mu.Lock()
			s.rss = append(s.rss, rssSample{at: at, process: process, library: n.library, mb: rss, cacheMB: cache})
			s.mu.Unlock()
		}
	}
}

// memory is a daemon's RSS and its KV cache's memory tier, in MiB, from
// one scrape (a daemon without a cache has none).
func memory(ctx context.Context, addr string) (rss, cache float64, err error) {
	body, err := scrape(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	m, err := loadbench.ParseMetrics(body, []string{"dragon_resident_memory_bytes", "dragon_kvcache_bytes"})
	if err != nil {
		return 0, 0, err
	}
	v, ok := m["dragon_resident_memory_bytes"]
	if !ok {
		return 0, 0, errors.New("no dragon_resident_memory_bytes")
	}
	return v / (1 << 20), m[`dragon_kvcache_bytes{tier="memory"}`] / (1 << 20), nil
}

// summarizeRSS reports the largest RSS seen, per minute and over the run,
// and how much any one process grew after its warm-up: 5 minutes, or a
// third of a shorter soak, from its first sample.
func (s *soak) summarizeRSS() {
	r := &s.rep.RSSMB
	warmup := min(5*time.Minute, s.o.Duration/3)
	r.WarmupS = warmup.Seconds()
	r.GrowthByProcess, r.OutsideCacheGrowthByProcess = map[string]float64{}, map[string]float64{}
	first := map[string]time.Duration{}
	atWarm := map[string]rssSample{}
	for _, x := range s.rss {
		minute := int(x.at / time.Minute)
		for len(r.Minutes) <= minute {
			r.Minutes = append(r.Minutes, RSSMinute{Minute: len(r.Minutes)})
		}
		m := &r.Minutes[minute]
		if x.cloud {
			m.CloudMax, r.CloudMax = max(m.CloudMax, x.mb), max(r.CloudMax, x.mb)
		} else {
			m.DeviceMax, r.DeviceMax = max(m.DeviceMax, x.mb), max(r.DeviceMax, x.mb)
		}
		t0, seen := first[x.process]
		if !seen {
			first[x.process], t0 = x.at, x.at
		}
		if x.at-t0 < warmup {
			continue
		}
		base, warm := atWarm[x.process]
		if !warm {
			atWarm[x.process] = x
			r.GrowthByProcess[x.process], r.OutsideCacheGrowthByProcess[x.process] = 0, 0
			continue
		}
		g := max(r.GrowthByProcess[x.process], x.mb/base.mb-1)
		o := max(r.OutsideCacheGrowthByProcess[x.process], (x.mb-x.cacheMB)/(base.mb-base.cacheMB)-1)
		r.GrowthByProcess[x.process], r.OutsideCacheGrowthByProcess[x.process] = g, o
		if !x.library {
			r.GrowthAfterWarmup, r.OutsideCacheGrowth = max(r.GrowthAfterWarmup, g), max(r.OutsideCacheGrowth, o)
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

// goroutineProfile is one daemon's goroutine profile: its total, and how
// many goroutines wait in each stack (its functions, one a line).
type goroutineProfile struct {
	total   int
	byStack map[string]int
}

// parseGoroutines reads a /debug/pprof/goroutine?debug=1 profile.
func parseGoroutines(dump string) (goroutineProfile, error) {
	p := goroutineProfile{byStack: map[string]int{}}
	if _, err := fmt.Sscanf(dump, "goroutine profile: total %d", &p.total); err != nil {
		return p, err
	}
	// Each record: "N @ pc pc ...", then its frames as "#\tpc\tfunction+off\tfile:line".
	for _, rec := range strings.Split(dump, "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		var n int
		if _, err := fmt.Sscanf(lines[0], "%d @", &n); err != nil {
			continue
		}
		var frames []string
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" {
				fn, _, _ := strings.Cut(f[2], "+0x") // the same stack, whatever the call site's offset
				frames = append(frames, fn)
			}
		}
		p.byStack[strings.Join(frames, "\n")] += n
	}
	return p, nil
}

// grown lists the stacks (by function) that hold more goroutines in p than
// in start.
func (p goroutineProfile) grown(start goroutineProfile) string {
	var b strings.Builder
	for stack, n := range p.byStack {
		if n > start.byStack[stack] {
			fmt.Fprintf(&b, "%d → %d in\n%s\n", start.byStack[stack], n, stack)
		}
	}
	return b.String()
}

// goroutines are each daemon's goroutine profile, by name, logged: the
// total of its goroutine profile, one snapshot (go_goroutines, read while
// the metrics handler and its collectors run, came out up to 2 over it).
func (s *soak) goroutines(ctx context.Context) map[string]goroutineProfile {
	out := map[string]goroutineProfile{}
	var each []string
	for i := range 1 + len(s.nodes) {
		name := "cloud"
		if i > 0 {
			name = fmt.Sprintf("device %d", i-1)
		}
		p, err := parseGoroutines(s.dump(ctx, name))
		if err != nil {
			s.logf("soak: %s's goroutines: %v", name, err)
		}
		out[name] = p
		each = append(each, fmt.Sprintf("%s %d", name, p.total))
	}
	s.logf("soak: goroutines: %s", strings.Join(each, ", "))
	return out
}

// leftOver waits (up to 15 s: streams and their connections wind down
// after the last answer) until no daemon has more goroutines than at the
// start, and returns their sum then. A daemon still over logs the stacks
// whose goroutines grew, for the person who reads the report.
func (s *soak) leftOver(ctx context.Context, start map[string]goroutineProfile) int {
	deadline := time.Now().Add(15 * time.Second)
	for {
		now, over := s.goroutines(ctx), []string{}
		total := 0
		for name, p := range now {
			total += p.total
			if p.total > start[name].total {
				over = append(over, name)
			}
		}
		if len(over) == 0 || time.Now().After(deadline) {
			for _, name := range over {
				s.logf("soak: %s has %d goroutines, %d at the start; grown:\n%s", name, now[name].total, start[name].total, now[name].grown(start[name]))
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
// by the link's faults may end before its entries are put). Their answers
// are counted by state like the others (a device counts their fallbacks
// too), but have no fault-free answer to be held to.
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
		a, err := aggbench.Ask(ctx, gen, s.request(q))
		s.record(n, -1, a, err)
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

// readCounters adds node n's fallback and stall counters to what it
// counted before.
func (s *soak) readCounters(ctx context.Context, n *node) {
	n.mu.Lock()
	addr := n.d.HTTPAddr()
	n.mu.Unlock()
	body, err := scrape(ctx, addr)
	if err != nil {
		return
	}
	samples, err := loadbench.ParseMetrics(body, []string{"dragon_fallbacks_total", "dragon_stalls_survived_total"})
	if err != nil {
		return
	}
	for sample, v := range samples {
		// dragon_fallbacks_total{reason="busy"}
		_, reason, ok := strings.Cut(sample, `reason="`)
		if !ok {
			n.counted[sample] += v
			continue
		}
		n.counted[strings.TrimSuffix(reason, `"}`)] += v
	}
}

// countCounters sums the devices' fallback counters by reason, and their
// stalls survived.
func (s *soak) countCounters(ctx context.Context) {
	for _, n := range s.nodes {
		s.readCounters(ctx, n)
		for key, v := range n.counted {
			if key == "dragon_stalls_survived_total" {
				s.rep.StallsSurvived += int(v)
			} else {
				s.rep.Fallback[key] += int(v)
			}
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

// documents are what the documents device acknowledged.
type documents struct {
	added   map[string]string // id: the one word of its text no other has
	deleted []string
}

// write gives the documents device a small document every few hundred
// milliseconds, and deletes every fourth an earlier one, until ctx ends;
// only what the device acknowledged is kept, a request its kill cut off
// is not.
func (s *soak) write(ctx context.Context, n *node) {
	for k := 0; ctx.Err() == nil; k++ {
		n.mu.Lock()
		addr := n.d.HTTPAddr()
		n.mu.Unlock()
		s.mu.Lock()
		some := len(s.docs.added) > 0
		s.mu.Unlock()
		if k%4 == 3 && some {
			s.deleteOne(ctx, addr)
		} else {
			word := uniqueWord(k)
			text := fmt.Sprintf("Soak note %d. The %s ledger was filed from a train on a link that stalled.", k, word)
			if id, err := upload(ctx, addr, fmt.Sprintf("soak/note-%d.txt", k), text); err == nil {
				s.mu.Lock()
				s.docs.added[id] = word
				s.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// deleteOne deletes the earliest document still there.
func (s *soak) deleteOne(ctx context.Context, addr string) {
	s.mu.Lock()
	ids := slices.Sorted(maps.Keys(s.docs.added))
	s.mu.Unlock()
	id := ids[0]
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "http://"+addr+"/v1/documents/"+id, nil)
	if err != nil {
		return
	}
	resp, err := scraper.Do(req)
	if err != nil {
		return
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		s.mu.Lock()
		delete(s.docs.added, id)
		s.docs.deleted = append(s.docs.deleted, id)
		s.mu.Unlock()
	}
}

// uniqueWord is a word of letters only, k's own: no other document and no
// question has it.
func uniqueWord(k int) string {
	b := []byte("zq")
	for k++; k > 0; k /= 26 {
		b = append(b, byte('a'+k%26))
	}
	return string(append(b, 'x'))
}

// upload adds one text file to a device and returns its id once the
// device acknowledged it.
func upload(ctx context.Context, addr, name, text string) (string, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	w, err := mw.CreateFormFile("file", name)
	if err != nil {
		return "", err
	}
	if _, err := io.WriteString(w, text); err != nil {
		return "", err
	}
	if err := mw.Close(); err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/documents", &body)
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := scraper.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Documents []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"documents"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || len(out.Documents) != 1 || out.Documents[0].Status == "failed" {
		return "", fmt.Errorf("upload %s: %d %+v", name, resp.StatusCode, out.Documents)
	}
	return out.Documents[0].ID, nil
}

// checkDocuments counts the documents device's broken acknowledgements:
// an added document that is not there or that a search for its own word
// does not find (given 30 s to be indexed), or a deleted one that is back.
func (s *soak) checkDocuments(ctx context.Context) {
	n := s.nodes[s.o.Devices]
	n.mu.Lock()
	base := "http://" + n.d.HTTPAddr() + "/v1/documents/"
	n.mu.Unlock()
	s.rep.Documents.Added, s.rep.Documents.Deleted = len(s.docs.added)+len(s.docs.deleted), len(s.docs.deleted)
	found := func(id, word string) bool {
		body, err := get(ctx, base+"search?k=3&q="+word)
		return err == nil && strings.Contains(body, `"document_id":"`+id+`"`)
	}
	deadline := time.Now().Add(30 * time.Second)
	for id, word := range s.docs.added {
		for !found(id, word) && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		if code, _ := httpStatus(ctx, base+id); code != http.StatusOK || !found(id, word) {
			s.rep.LostAcks++
			s.logf("soak: acknowledged document %s (%s) is lost: %d", id, word, code)
		}
	}
	for _, id := range s.docs.deleted {
		if code, _ := httpStatus(ctx, base+id); code != http.StatusNotFound {
			s.rep.LostAcks++
			s.logf("soak: deleted document %s is back: %d", id, code)
		}
	}
}

// httpStatus is the HTTP status of a GET of url.
func httpStatus(ctx context.Context, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := scraper.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
