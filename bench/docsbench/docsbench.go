// Package docsbench measures the device's document API as its owner meets
// it (`dragon bench docs`): a device daemon started on an empty index is
// fed the mailbox over HTTP, and the harness measures how fast it ingests,
// how soon an acknowledged file is retrievable, what ingestion does to the
// time to first token of questions asked meanwhile, whether a kill -9
// loses an acknowledged file, and how search, adds and memory grow as the
// mailbox grows.
package docsbench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/bench/aggbench"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
)

// Options configure a run.
type Options struct {
	Binary, Model string
	// Mailbox is a folder of .eml files: the corpus fed to the device.
	Mailbox string
	// Scales are the multiples of the mailbox measured (1, 4, 10): the
	// mail is fed again under new names until the index holds that many
	// copies.
	Scales []int
	// Kills is how many kill -9 cycles to run.
	Kills int
	// Questions are asked for the time to first token, idle and while
	// the second copy of the mailbox is being fed.
	Questions []string
	// Batch is the files per upload request.
	Batch int
	// Formats is make formats' folder of real files, scored for
	// extraction ("": not scored).
	Formats string
	// EmbedModel, if set, makes the device's index dense, embedded with
	// it (a GGUF, or "random" for the memory and time of vectors without
	// the hours of embedding ten mailboxes).
	EmbedModel string
	Cores      string
	Work       string // a folder for the indexes
	Log        func(format string, args ...any)
}

// Percentiles of a measurement, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
}

// ScalePoint is the device at one size of its corpus.
type ScalePoint struct {
	Copies      int     `json:"copies"`
	Passages    int     `json:"passages"`
	SearchP95MS float64 `json:"search_p95_ms"`
	AddMSP50    float64 `json:"add_ms_p50"`
	RSSMB       float64 `json:"rss_mb"`
	// SettleS is how long a dense index took, after the feed, to have
	// every vector computed and written to its vectors file, which the
	// measurements wait for: the device's state between bursts of mail.
	SettleS float64 `json:"settle_s,omitempty"`
}

// TTFT is the time to first token's 95th percentile, idle and while
// files are being added.
type TTFT struct {
	Idle      float64 `json:"idle"`
	Ingesting float64 `json:"ingesting"`
}

// Report is `dragon bench docs --json`.
type Report struct {
	Date               string      `json:"date"`
	CPUs               int         `json:"cpus"`
	Model              string      `json:"model"`
	MailFiles          int         `json:"mail_files"`
	IngestDocsPerS     float64     `json:"ingest_docs_per_s"`
	IngestMBPerS       float64     `json:"ingest_mb_per_s"`
	AckToRetrievableMS Percentiles `json:"ack_to_retrievable_ms"`
	TTFTP95MS          TTFT        `json:"ttft_p95_ms"`
	// TTFTDuringIngestion is how many questions were answered while files
	// were still being added (the "ingesting" percentile's sample).
	TTFTDuringIngestion int          `json:"ttft_questions_during_ingestion"`
	LostAfterKill       int          `json:"lost_after_kill"`
	Kills               int          `json:"kills"`
	AckedBeforeKills    int          `json:"acked_before_kills"`
	Scale               []ScalePoint `json:"scale"`
	// Formats is extraction's quality by format, on real files.
	Formats map[string]FormatScore `json:"formats,omitempty"`
}

type file struct {
	name string
	data []byte
}

// device is a running device daemon and its clients.
type device struct {
	d    *aggbench.Daemon
	gen  dragonv1.DeviceServiceClient
	conn *grpc.ClientConn
	base string
}

func (o Options) start(index string) (*device, error) {
	args := []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--model", o.Model, "--index", index, "--cloud", "", "--profile", "", "--rerank-model", "", "--threads", "1", "--kv-cache-mb", "0"}
	if o.EmbedModel != "" {
		args = append(args, "--embed-model", o.EmbedModel)
	}
	d, err := aggbench.StartDaemon("device", o.Cores, nil, append([]string{o.Binary}, args...)...)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for d.HTTPAddr() == "" {
		if time.Now().After(deadline) {
			d.Kill()
			return nil, fmt.Errorf("the device serves no HTTP after a minute:\n%s", d.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient(d.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		d.Kill()
		return nil, err
	}
	return &device{d: d, gen: dragonv1.NewDeviceServiceClient(conn), conn: conn, base: "http://" + d.HTTPAddr()}, nil
}

func (dv *device) stop() error {
	dv.conn.Close()
	return dv.d.Stop(time.Minute)
}

// upload posts files and returns the documents acknowledged (not failed).
func (dv *device) upload(ctx context.Context, files []file) ([]map[string]any, error) {
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, f := range files {
		w, err := mw.CreateFormFile("file", f.name)
		if err != nil {
			return nil, err
		}
		w.Write(f.data)
	}
	mw.Close()
	req, err := http.NewRequestWithContext(ctx, "POST", dv.base+"/v1/documents", &body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out struct {
		Documents []map[string]any `json:"documents"`
		Error     *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("upload: %d: %w", resp.StatusCode, err)
	}
	if resp.StatusCode != http.StatusOK && out.Error != nil {
		return nil, fmt.Errorf("upload: %d: %s", resp.StatusCode, out.Error.Message)
	}
	var acked []map[string]any
	for _, d := range out.Documents {
		if d["status"] != "failed" {
			acked = append(acked, d)
		}
	}
	return acked, nil
}

// get fetches path from the daemon's HTTP port.
func (dv *device) get(ctx context.Context, path string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", dv.base+path, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// getJSON fetches path and decodes its JSON into v (nil: only the status).
func (dv *device) getJSON(ctx context.Context, path string, v any) (int, error) {
	code, b, err := dv.get(ctx, path)
	if err != nil || v == nil {
		return code, err
	}
	return code, json.Unmarshal(b, v)
}

func (dv *device) search(ctx context.Context, q string, k int) ([]string, error) {
	var out struct {
		Hits []struct {
			Source string `json:"source"`
		} `json:"hits"`
	}
	if _, err := dv.getJSON(ctx, "/v1/documents/search?k="+strconv.Itoa(k)+"&q="+url.QueryEscape(q), &out); err != nil {
		return nil, err
	}
	var srcs []string
	for _, h := range out.Hits {
		srcs = append(srcs, h.Source)
	}
	return srcs, nil
}

// metric reads one gauge of the daemon's /metrics.
func (dv *device) metric(ctx context.Context, name string) (float64, error) {
	_, b, err := dv.get(ctx, "/metrics")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no %s in /metrics", name)
}

func (dv *device) ttft(ctx context.Context, q string) (float64, error) {
	a, err := aggbench.Ask(ctx, dv.gen, &dragonv1.GenerateRequest{Prompt: q, Mode: dragonv1.Mode_MODE_DEVICE_ONLY,
		Sampling: &dragonv1.SamplingParams{MaxTokens: 2}})
	if err != nil {
		return 0, err
	}
	return float64(a.Summary.GetTtft().AsDuration().Microseconds()) / 1000, nil
}

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

// readMailbox reads the .eml files of a folder, sorted.
func readMailbox(dir string) ([]file, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.eml"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no .eml files in %s", dir)
	}
	slices.Sort(paths)
	out := make([]file, 0, len(paths))
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, file{filepath.Base(p), b})
	}
	return out, nil
}

// emptyIndex builds an index of no files at dir.
func (o Options) emptyIndex(ctx context.Context, dir string) error {
	empty := filepath.Join(o.Work, "empty")
	if err := os.MkdirAll(empty, 0o755); err != nil {
		return err
	}
	args := []string{"index", "build", "--dir", dir, "--model", o.Model, "--dense=false", empty}
	if o.EmbedModel != "" {
		args = []string{"index", "build", "--dir", dir, "--model", o.Model, "--dense", "--embed-model", o.EmbedModel, empty}
	}
	out, err := exec.CommandContext(ctx, o.Binary, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("index build: %w\n%s", err, out)
	}
	return nil
}

// settle waits until the dense index at dir has all of its passages'
// vectors on disk: none pending, and the newest vectors file holding as
// many as there are passages.
func settle(ctx context.Context, dv *device, dir string, passages int) error {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		var st struct {
			Pending int `json:"pending_vectors"`
		}
		if _, err := dv.getJSON(ctx, "/v1/documents/stats", &st); err != nil {
			return err
		}
		if st.Pending == 0 && vectorsOnDisk(dir) == passages {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dense index %s not settled after 10 minutes (%d pending, %d of %d vectors on disk)", dir, st.Pending, vectorsOnDisk(dir), passages)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// vectorsOnDisk is the count in the header of the vectors file that
// dir's manifest names (-1 if none can be read): the vectors a committed
// checkpoint holds. (A newer vectors file may be on disk before its
// checkpoint has written the passages and committed; searches measured
// then would overlap the rest of that checkpoint.)
func vectorsOnDisk(dir string) int {
	man, err := retrieval.ReadManifest(dir)
	if err != nil {
		return -1
	}
	f, err := os.Open(filepath.Join(dir, man.VectorsFile()))
	if err != nil {
		return -1
	}
	defer f.Close()
	hdr := make([]byte, 24)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return -1
	}
	return int(binary.LittleEndian.Uint64(hdr[16:]))
}

// feed uploads one copy of the mailbox under the prefix, a batch at a
// time, and returns the bytes sent.
func feed(ctx context.Context, dv *device, mail []file, prefix string, batch int) (int64, error) {
	var n int64
	for i := 0; i < len(mail); i += batch {
		var fs []file
		for _, f := range mail[i:min(i+batch, len(mail))] {
			fs = append(fs, file{prefix + f.name, f.data})
			n += int64(len(f.data))
		}
		acked, err := dv.upload(ctx, fs)
		if err != nil {
			return n, err
		}
		if len(acked) == 0 {
			return n, fmt.Errorf("no file of a batch of %d acknowledged", len(fs))
		}
	}
	return n, nil
}

// Run measures and reports.
func Run(ctx context.Context, o Options) (Report, error) {
	if o.Batch <= 0 {
		o.Batch = 256
	}
	if len(o.Scales) == 0 {
		o.Scales = []int{1, 4, 10}
	}
	logf := o.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), Model: filepath.Base(o.Model), Kills: o.Kills}
	mail, err := readMailbox(o.Mailbox)
	if err != nil {
		return rep, err
	}
	rep.MailFiles = len(mail)
	if o.Formats != "" {
		if rep.Formats, err = Formats(o.Formats); err != nil {
			return rep, err
		}
	}
	index := filepath.Join(o.Work, "index")
	if err := o.emptyIndex(ctx, index); err != nil {
		return rep, err
	}
	dv, err := o.start(index)
	if err != nil {
		return rep, err
	}
	defer func() { dv.stop() }()

	// The first copy: ingestion's rate.
	start := time.Now()
	sent, err := feed(ctx, dv, mail, "mail/", o.Batch)
	if err != nil {
		return rep, err
	}
	el := time.Since(start).Seconds()
	rep.IngestDocsPerS, rep.IngestMBPerS = float64(len(mail))/el, float64(sent)/(1<<20)/el
	logf("ingested %d mails (%.1f MB) in %.1f s", len(mail), float64(sent)/(1<<20), el)

	// Acknowledged to retrievable: a file of a word of its own, then its
	// search until it is found.
	var ack []float64
	for i := range 50 {
		word := fmt.Sprintf("zqx%dwuv", i)
		if _, err := dv.upload(ctx, []file{{fmt.Sprintf("probe/%d.txt", i), []byte("A note about " + word + " and nothing else.")}}); err != nil {
			return rep, err
		}
		acked := time.Now()
		for {
			srcs, err := dv.search(ctx, word, 1)
			if err != nil {
				return rep, err
			}
			if len(srcs) > 0 {
				break
			}
			if time.Since(acked) > time.Minute {
				return rep, fmt.Errorf("%s not retrievable a minute after its ack", word)
			}
			time.Sleep(time.Millisecond)
		}
		ack = append(ack, float64(time.Since(acked).Microseconds())/1000)
	}
	rep.AckToRetrievableMS = Percentiles{quantile(ack, 0.5), quantile(ack, 0.99)}

	// Time to first token, idle, then while the second copy is fed.
	var idle, busy []float64
	for _, q := range o.Questions {
		ms, err := dv.ttft(ctx, q)
		if err != nil {
			return rep, err
		}
		idle = append(idle, ms)
	}
	rep.TTFTP95MS.Idle = quantile(idle, 0.95)
	copies := 1
	point := func() error {
		var st struct {
			Passages int `json:"passages"`
		}
		if _, err := dv.getJSON(ctx, "/v1/documents/stats", &st); err != nil {
			return err
		}
		p := ScalePoint{Copies: copies, Passages: st.Passages}
		if o.EmbedModel != "" {
			t := time.Now()
			if err := settle(ctx, dv, index, st.Passages); err != nil {
				return err
			}
			p.SettleS = time.Since(t).Seconds()
		}
		rng := rand.New(rand.NewPCG(uint64(copies), 1))
		var searches, adds []float64
		for range 100 {
			m := mail[rng.IntN(len(mail))]
			q := subject(m.data)
			t := time.Now()
			if _, err := dv.search(ctx, q, 5); err != nil {
				return err
			}
			searches = append(searches, float64(time.Since(t).Microseconds())/1000)
		}
		for i := range 20 {
			m := mail[rng.IntN(len(mail))]
			t := time.Now()
			if _, err := dv.upload(ctx, []file{{fmt.Sprintf("single/%d-%d-%s", copies, i, m.name), m.data}}); err != nil {
				return err
			}
			adds = append(adds, float64(time.Since(t).Microseconds())/1000)
		}
		rss, err := dv.metric(ctx, "dragon_resident_memory_bytes")
		if err != nil {
			return err
		}
		p.SearchP95MS, p.AddMSP50, p.RSSMB = quantile(searches, 0.95), quantile(adds, 0.5), rss/(1<<20)
		rep.Scale = append(rep.Scale, p)
		logf("%d copies: %d passages, search p95 %.1f ms, add p50 %.1f ms, RSS %.0f MB", copies, p.Passages, p.SearchP95MS, p.AddMSP50, p.RSSMB)
		return nil
	}
	for i, target := range o.Scales {
		if i == 1 || (i == 0 && target > 1) {
			// The questions are asked while the copies up to this scale
			// are fed; only those answered before the feed ends count.
			from := copies
			var wg sync.WaitGroup
			var ferr error
			var feeding sync.Mutex
			done := false
			wg.Go(func() {
				for c := from + 1; c <= target && ferr == nil; c++ {
					_, ferr = feed(ctx, dv, mail, fmt.Sprintf("copy%d/", c), o.Batch)
				}
				feeding.Lock()
				done = true
				feeding.Unlock()
			})
			time.Sleep(time.Second)
			for _, q := range o.Questions {
				ms, err := dv.ttft(ctx, q)
				if err != nil {
					return rep, err
				}
				feeding.Lock()
				if !done {
					busy = append(busy, ms)
				}
				feeding.Unlock()
			}
			wg.Wait()
			if ferr != nil {
				return rep, ferr
			}
			copies = target
			rep.TTFTP95MS.Ingesting = quantile(busy, 0.95)
			rep.TTFTDuringIngestion = len(busy)
		}
		for copies < target {
			copies++
			if _, err := feed(ctx, dv, mail, fmt.Sprintf("copy%d/", copies), o.Batch); err != nil {
				return rep, err
			}
		}
		if err := point(); err != nil {
			return rep, err
		}
	}
	if err := dv.stop(); err != nil {
		return rep, err
	}

	lost, acked, err := o.kills(ctx, mail)
	rep.LostAfterKill, rep.AckedBeforeKills = lost, acked
	return rep, err
}

// kills adds files to a fresh device and kills it -9 at random moments;
// after each restart every file it acknowledged must be there.
func (o Options) kills(ctx context.Context, mail []file) (lost, acked int, err error) {
	if o.Kills == 0 {
		return 0, 0, nil
	}
	index := filepath.Join(o.Work, "kill-index")
	if err := o.emptyIndex(ctx, index); err != nil {
		return 0, 0, err
	}
	rng := rand.New(rand.NewPCG(7, 7))
	var ids []string
	next := 0
	for cycle := range o.Kills {
		dv, err := o.start(index)
		if err != nil {
			return lost, len(ids), err
		}
		for _, id := range ids {
			if code, err := dv.getJSON(ctx, "/v1/documents/"+id, nil); err != nil || code != http.StatusOK {
				lost++
			}
		}
		ids = ids[:0]
		kill := time.After(time.Duration(200+rng.IntN(800)) * time.Millisecond)
	feed:
		for {
			select {
			case <-kill:
				break feed
			default:
			}
			m := mail[next%len(mail)]
			docs, err := dv.upload(ctx, []file{{fmt.Sprintf("k%d/%s", next, m.name), m.data}})
			next++
			if err != nil {
				break // killed mid-request
			}
			for _, d := range docs {
				ids = append(ids, d["id"].(string))
			}
			acked += len(docs)
		}
		dv.d.Kill()
		dv.conn.Close()
		if o.Log != nil {
			o.Log("kill %d: %d acknowledged so far, %d lost", cycle+1, acked, lost)
		}
	}
	dv, err := o.start(index)
	if err != nil {
		return lost, acked, err
	}
	defer dv.stop()
	for _, id := range ids {
		if code, err := dv.getJSON(ctx, "/v1/documents/"+id, nil); err != nil || code != http.StatusOK {
			lost++
		}
	}
	return lost, acked, nil
}

// subject is a mail's Subject header, a search a person would make.
func subject(raw []byte) string {
	for line := range strings.Lines(string(raw)) {
		if s, ok := strings.CutPrefix(line, "Subject:"); ok {
			if s = strings.TrimSpace(s); s != "" {
				return s
			}
		}
		if strings.TrimSpace(line) == "" {
			break
		}
	}
	return "mail"
}
