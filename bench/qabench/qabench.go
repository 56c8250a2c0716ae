package qabench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/retrievalbench"
	"github.com/dragon-rag/dragon/internal/timing"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// Modes are the ways of answering, weakest first: the device's model
// alone (none), each side with its own passages, both sides' passages in
// one prompt on the device (the centralized, privacy-breaking DRCG/Text),
// and DRAGON.
var Modes = []string{"none", "device-only", "cloud-only", "context", "dragon"}

var modeOf = map[string]dragonv1.Mode{
	"none":        dragonv1.Mode_MODE_DEVICE_ONLY, // on a device daemon without an index
	"device-only": dragonv1.Mode_MODE_DEVICE_ONLY,
	"cloud-only":  dragonv1.Mode_MODE_CLOUD_ONLY,
	"context":     dragonv1.Mode_MODE_CONTEXT,
	"dragon":      dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION,
	"tw":          dragonv1.Mode_MODE_TOKEN_WISE_SYNC,
}

// CheckModes refuses an unknown mode name.
func CheckModes(modes []string) error {
	if len(modes) == 0 {
		return errors.New("qabench: no modes")
	}
	for _, m := range modes {
		if _, ok := modeOf[m]; !ok {
			return fmt.Errorf("qabench: unknown mode %q (want %s or tw)", m, strings.Join(Modes, ", "))
		}
	}
	return nil
}

// ShortAnswer is the system message of every question: the gold answers
// are short spans (a name, a date, a number).
const ShortAnswer = "Answer the question with a short answer: a few words, a name, a date or a number. Do not explain."

// Split assigns the files of a corpus to the cloud (the public half) or
// the device (standing in for private data) by a hash of their path
// relative to root: deterministic, and independent of what else the
// folder holds.
func Split(root string) (cloud, device []string, err error) {
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".txt") {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		h := fnv.New32a()
		h.Write([]byte(filepath.ToSlash(rel)))
		if h.Sum32()%2 == 0 {
			cloud = append(cloud, path)
		} else {
			device = append(device, path)
		}
		return nil
	})
	if err == nil && (len(cloud) == 0 || len(device) == 0) {
		err = fmt.Errorf("qabench: %s holds too few .txt files to split (make wiki fetches the corpus)", root)
	}
	return cloud, device, err
}

// Labelled is a question with its gold answers and where it came from.
type Labelled struct {
	Source string `json:"source"` // the topics file's base name
	Line   int    `json:"line"`   // 1-based
	retrievalbench.Question
}

// Sample keeps the questions whose answer some passage holds (DPR's
// has-answer test) and draws n of them with the seed, in a fixed order.
func Sample(qs []Labelled, passages []string, n int, seed uint64) ([]Labelled, int) {
	ix := retrievalbench.NewAnswerIndex(passages)
	var ok []Labelled
	for _, q := range qs {
		if len(ix.Holding(q.Answers)) > 0 {
			ok = append(ok, q)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x51ab1e))
	rng.Shuffle(len(ok), func(i, j int) { ok[i], ok[j] = ok[j], ok[i] })
	return ok[:min(n, len(ok))], len(ok)
}

// LoadTopics reads topics files in the format make wiki writes.
func LoadTopics(paths ...string) ([]Labelled, error) {
	var out []Labelled
	for _, p := range paths {
		qs, err := retrievalbench.LoadQuestions(p)
		if err != nil {
			return nil, err
		}
		for i, q := range qs {
			out = append(out, Labelled{Source: filepath.Base(p), Line: i + 1, Question: q})
		}
	}
	return out, nil
}

// WriteTopics writes questions as a topics file in make wiki's format
// (question TAB a Python list of answers), so that another pairing can be
// asked exactly these with --questions.
func WriteTopics(path string, qs []Labelled) error {
	var b strings.Builder
	for _, q := range qs {
		b.WriteString(strings.ReplaceAll(q.Text, "\t", " "))
		b.WriteString("\t[")
		for i, a := range q.Answers {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(a) + "'")
		}
		b.WriteString("]\n")
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// Options configure Run.
type Options struct {
	// Binary is the dragon binary the daemons run.
	Binary                  string
	DeviceModel, CloudModel string
	DeviceIndex, CloudIndex string
	// DeviceProfile and CloudProfile are dragon profile fits ("": none).
	DeviceProfile, CloudProfile string
	Questions                   []Labelled
	Modes                       []string
	K                           int // passages per side
	MaxTokens                   int
	// Retrieval is both daemons' ranker (--retrieval; "" is auto: hybrid
	// over these indexes).
	Retrieval string
	// Weights is how passages are weighed: "static" (the first stage's R),
	// "rerank" (RerankModel re-ranks RerankCandidates first-stage passages
	// per side; R its logit), "dynamic" (re-ranked, then re-scored every
	// RescoreEvery answer tokens: DRAGON §4.1), or "posterior" and
	// "rerank-posterior" (the first stage's or the re-ranker's R, then
	// each passage's posterior given the answer so far every
	// PosteriorEvery tokens: the daemons' --posterior-every).
	Weights          string
	RerankModel      string
	RerankCandidates int
	RescoreEvery     int
	PosteriorEvery   int
	// DevicePassages and CloudPassages are each half's passages' texts by
	// id, for testing whether an answer's sources hold the gold answer.
	DevicePassages, CloudPassages map[uint64]string
	// Confidence > 0 weighs each step of the modes that aggregate both
	// sides by the sides' confidence too (GenerateRequest's
	// confidence_temperature).
	Confidence float64
	// ClosedBook, when not empty, is the relevance both daemons give the
	// closed-book document they add to every retrieval (their
	// --closed-book): the modes that retrieve then mix in what each side's
	// model answers with no passage.
	ClosedBook string
	// ClosedBookSides is which daemons add it: "" or "both", "cloud" or
	// "device" (a side whose model knows little may leave its closed book
	// to the other's).
	ClosedBookSides string
	// Records is the JSON-lines file of per-question records; an existing
	// one of the same configuration is resumed.
	Records string
	// Seed is the sampling seed (recorded; answers are greedy).
	Seed uint64
	Log  func(format string, args ...any)
}

// Record is one answer.
type Record struct {
	Source   string   `json:"source"`
	Line     int      `json:"line"`
	Mode     string   `json:"mode"`
	Question string   `json:"question"`
	Gold     []string `json:"gold"`
	Answer   string   `json:"answer"`
	Tokens   int      `json:"tokens"`
	Scores
	PerTokenMS float64 `json:"per_token_ms"`
	TTFTMS     float64 `json:"ttft_ms"`
	// Fallback is set when the device answered alone (the cloud failed).
	Fallback bool `json:"fallback,omitempty"`
	// Where the answer's sources came back: whether the passage of the
	// largest share, and the passage of the highest relevance score, hold a
	// gold answer (DPR's has-answer test on the passage's text; absent
	// without sources).
	TopShareHasAnswer *bool `json:"top_share_has_answer,omitempty"`
	TopScoreHasAnswer *bool `json:"top_score_has_answer,omitempty"`
	// Sources are the answer's sources as the device listed them, largest
	// share first.
	Sources []RecordSource `json:"sources,omitempty"`
}

// RecordSource is one of an answer's sources: its side and passage, its
// relevance and share, and whether its passage holds a gold answer.
type RecordSource struct {
	Side       string  `json:"side"`
	PassageID  uint64  `json:"passage_id"`
	ClosedBook bool    `json:"closed_book,omitempty"`
	Score      float64 `json:"score"`
	Share      float64 `json:"share"`
	HasAnswer  bool    `json:"has_answer"`
}

// header is the first line of a records file: what its answers depend on.
type header struct {
	Config config `json:"config"`
}

type config struct {
	DeviceModel string  `json:"device_model"`
	CloudModel  string  `json:"cloud_model"`
	K           int     `json:"k"`
	MaxTokens   int     `json:"max_tokens"`
	Seed        uint64  `json:"seed"`
	System      string  `json:"system"`
	Retrieval   string  `json:"retrieval,omitempty"`
	Weights     string  `json:"weights,omitempty"`
	Candidates  int     `json:"rerank_candidates,omitempty"`
	Every       int     `json:"rescore_every,omitempty"`
	Posterior   int     `json:"posterior_every,omitempty"`
	Confidence  float64 `json:"confidence_temperature,omitempty"`
	ClosedBook  string  `json:"closed_book,omitempty"`
	Sides       string  `json:"closed_book_sides,omitempty"`
}

// Result is the benchmark's JSON: per mode, the mean scores and the median
// time per answer token and TTFT.
type Result struct {
	N           int                `json:"n"`
	K           int                `json:"k"`
	DeviceModel string             `json:"device_model"`
	CloudModel  string             `json:"cloud_model"`
	EM          map[string]float64 `json:"em"`
	F1          map[string]float64 `json:"f1"`
	Contained   map[string]float64 `json:"contained"`
	PerTokenMS  map[string]float64 `json:"per_token_ms"`
	TTFTMS      map[string]float64 `json:"ttft_ms"`
	// Fallbacks counts answers the device gave alone, per mode.
	Fallbacks map[string]int `json:"fallbacks,omitempty"`
	// TopSourceContainsAnswer is, per mode, among the answers that contain
	// a gold answer, the fraction whose largest-share source holds it too;
	// TopScoreContainsAnswer the same for the source of the highest
	// retrieval score (what a list of retrieved passages would put first);
	// SourcesCounted how many answers those fractions are over.
	TopSourceContainsAnswer map[string]float64 `json:"top_source_contains_answer"`
	TopScoreContainsAnswer  map[string]float64 `json:"top_score_contains_answer"`
	// AnySourceContainsAnswer is, over the same answers, the fraction with
	// any source that holds it: what a citation could at best point to.
	AnySourceContainsAnswer map[string]float64 `json:"any_source_contains_answer"`
	SourcesCounted          map[string]int     `json:"sources_counted"`
	Records                 string             `json:"records"`
	Retrieval               string             `json:"retrieval"`
	Weights                 string             `json:"weights"`
	// RerankCandidates is the first-stage passages re-ranked per side
	// (weights "rerank" and "dynamic"), RescoreEvery the tokens between
	// re-scorings ("dynamic").
	RerankCandidates int `json:"rerank_candidates,omitempty"`
	RescoreEvery     int `json:"rescore_every,omitempty"`
	// PosteriorEvery is the tokens between posterior weightings (weights
	// "posterior", "rerank-posterior").
	PosteriorEvery int `json:"posterior_every,omitempty"`
	// Confidence is the confidence temperature (0: off).
	Confidence float64 `json:"confidence_temperature,omitempty"`
	// ClosedBook is the closed-book document's relevance ("": none), and
	// ClosedBookSides the daemons that add it ("": both).
	ClosedBook      string `json:"closed_book,omitempty"`
	ClosedBookSides string `json:"closed_book_sides,omitempty"`
}

func key(source string, line int, mode string) string {
	return source + ":" + strconv.Itoa(line) + ":" + mode
}

// CheckClosedBook checks a closed-book relevance (empty: none) and the
// sides that add it, and returns the sides as Options keeps them: "" for
// both, "cloud" or "device".
func CheckClosedBook(relevance, sides string) (string, error) {
	if relevance != "" {
		if _, err := session.ParseClosedBook(relevance); err != nil {
			return "", fmt.Errorf("qabench: %w", err)
		}
	}
	switch sides {
	case "both":
		sides = ""
	case "", "cloud", "device":
	default:
		return "", fmt.Errorf("qabench: closed-book sides %q: want both, cloud or device", sides)
	}
	if relevance == "" && sides != "" {
		return "", fmt.Errorf("qabench: closed-book sides %s without a closed-book relevance", sides)
	}
	return sides, nil
}

// readRecords loads a records file of the configuration want (none: a
// missing file).
func readRecords(path string, want config) (map[string]Record, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Record{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	done := map[string]Record{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if line == 1 {
			var h header
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				return nil, fmt.Errorf("%s:1: not a records file: %w", path, err)
			}
			if h.Config != want {
				return nil, fmt.Errorf("%s was written for %+v, not %+v: give another --records file", path, h.Config, want)
			}
			continue
		}
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			// A run killed mid-write leaves a partial last line: it is
			// asked again.
			continue
		}
		done[key(r.Source, r.Line, r.Mode)] = r
	}
	return done, sc.Err()
}

// Run answers every question in every mode through a live device daemon
// (core 1) and cloud daemon (core 0), one thread each, resuming from the
// records file, and scores the answers.
func Run(ctx context.Context, o Options) (Result, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if err := CheckModes(o.Modes); err != nil {
		return Result{}, err
	}
	if !aggregator.ValidConfidence(o.Confidence) {
		return Result{}, fmt.Errorf("qabench: confidence temperature %v: want 0 (off) or a positive number", o.Confidence)
	}
	var err error
	if o.ClosedBookSides, err = CheckClosedBook(o.ClosedBook, o.ClosedBookSides); err != nil {
		return Result{}, err
	}
	if err := checkWeights(&o); err != nil {
		return Result{}, err
	}
	cfg := config{DeviceModel: filepath.Base(o.DeviceModel), CloudModel: filepath.Base(o.CloudModel), K: o.K, MaxTokens: o.MaxTokens, Seed: o.Seed, System: ShortAnswer, Retrieval: o.Retrieval,
		Weights: o.Weights, Candidates: o.RerankCandidates, Every: o.RescoreEvery, Posterior: o.PosteriorEvery, Confidence: o.Confidence, ClosedBook: o.ClosedBook, Sides: o.ClosedBookSides}
	done, err := readRecords(o.Records, cfg)
	if err != nil {
		return Result{}, err
	}
	todo := 0
	for _, q := range o.Questions {
		for _, m := range o.Modes {
			if _, ok := done[key(q.Source, q.Line, m)]; !ok {
				todo++
			}
		}
	}
	o.Log("qa: %d questions × %d modes, %d answers recorded in %s, %d to go", len(o.Questions), len(o.Modes), len(o.Questions)*len(o.Modes)-todo, o.Records, todo)
	if todo > 0 {
		if err := answerAll(ctx, o, cfg, done, todo); err != nil {
			return Result{}, err
		}
	}
	return summarize(o, cfg, done), nil
}

// answerAll starts the daemons and answers what the records lack,
// appending each record as it comes.
func answerAll(ctx context.Context, o Options, cfg config, done map[string]Record, todo int) error {
	if err := os.MkdirAll(filepath.Dir(o.Records), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(o.Records, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() == 0 {
		if err := appendJSON(f, header{cfg}); err != nil {
			return err
		}
	}
	k := strconv.Itoa(o.K)
	common := []string{"--threads", "1", "--listen", "127.0.0.1:0", "--http", "", "--passages", k, "--max-tokens-limit", strconv.Itoa(max(o.MaxTokens, 512)),
		"--retrieval", cmp.Or(o.Retrieval, "auto")}
	// The two sides with an index.
	rerank := []string{"--rerank-model", o.RerankModel, "--posterior-every", strconv.Itoa(o.PosteriorEvery)}
	if o.RerankModel != "" {
		rerank = append(rerank, "--rerank-candidates", strconv.Itoa(o.RerankCandidates), "--rescore-every", strconv.Itoa(o.RescoreEvery))
	}
	closed := map[string][]string{}
	for _, side := range []string{"cloud", "device"} {
		if o.ClosedBook != "" && (o.ClosedBookSides == "" || o.ClosedBookSides == side) {
			closed[side] = []string{"--closed-book", o.ClosedBook}
		}
	}
	cloud, err := aggbench.StartDaemon("cloud", "0", nil, slices.Concat([]string{o.Binary, "cloud", "--model", o.CloudModel, "--index", o.CloudIndex, "--profile", o.CloudProfile}, rerank, closed["cloud"], common)...)
	if err != nil {
		return fmt.Errorf("qabench: cloud: %w", err)
	}
	defer cloud.Stop(10 * time.Second)
	device, err := aggbench.StartDaemon("device", "1", nil, slices.Concat([]string{o.Binary, "device", "--model", o.DeviceModel, "--index", o.DeviceIndex, "--profile", o.DeviceProfile,
		"--cloud", cloud.Addr, "--cloud-passages", k,
		// A 1.5B cloud prefills its passages slowly on a small CPU: the
		// device waits for it rather than answering alone.
		"--cloud-timeout", "5m"}, rerank, closed["device"], common)...)
	if err != nil {
		return fmt.Errorf("qabench: device: %w", err)
	}
	defer device.Stop(10 * time.Second)
	clients := map[bool]dragonv1.DeviceServiceClient{}
	var conns []*grpc.ClientConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dial := func(addr string) (dragonv1.DeviceServiceClient, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		conns = append(conns, conn)
		return dragonv1.NewDeviceServiceClient(conn), nil
	}
	if clients[false], err = dial(device.Addr); err != nil {
		return err
	}
	if slices.Contains(o.Modes, "none") {
		// The model alone: a device daemon with no index and no cloud.
		bare, err := aggbench.StartDaemon("device-bare", "1", nil, append([]string{o.Binary, "device", "--model", o.DeviceModel, "--index", "", "--cloud", "", "--profile", o.DeviceProfile}, common...)...)
		if err != nil {
			return fmt.Errorf("qabench: device without retrieval: %w", err)
		}
		defer bare.Stop(10 * time.Second)
		if clients[true], err = dial(bare.Addr); err != nil {
			return err
		}
	}
	start, answered := time.Now(), 0
	for qi, q := range o.Questions {
		for _, m := range o.Modes {
			kk := key(q.Source, q.Line, m)
			if _, ok := done[kk]; ok {
				continue
			}
			req := &dragonv1.GenerateRequest{Prompt: q.Text, System: ShortAnswer, Mode: modeOf[m],
				Sampling: &dragonv1.SamplingParams{MaxTokens: uint32(o.MaxTokens)}, ConfidenceTemperature: float32(o.Confidence)}
			a, err := aggbench.Ask(ctx, clients[m == "none"], req)
			if err != nil {
				return fmt.Errorf("qabench: %s, question %s:%d: %w\ndevice:\n%s\ncloud:\n%s", m, q.Source, q.Line, err, tail(device.Logs()), tail(cloud.Logs()))
			}
			s := a.Summary
			r := Record{Source: q.Source, Line: q.Line, Mode: m, Question: q.Text, Gold: q.Answers, Answer: strings.TrimSpace(a.Text),
				Tokens: len(a.Tokens), PerTokenMS: timing.MS(s.GetTokenLatencyMean().AsDuration()), TTFTMS: timing.MS(s.GetTtft().AsDuration()),
				Fallback: s.GetFallback()}
			r.Scores = Score(r.Answer, r.Gold)
			r.Sources = o.recordSources(s.GetSources(), r.Gold)
			r.TopShareHasAnswer, r.TopScoreHasAnswer = topSources(r.Sources)
			if err := appendJSON(f, r); err != nil {
				return err
			}
			done[kk] = r
			answered++
			eta := time.Duration(float64(time.Since(start)) / float64(answered) * float64(todo-answered))
			o.Log("qa %d/%d (question %d/%d) %-11s em %.0f f1 %.2f contained %.0f %5.0f ms/token ttft %6.0f ms  %q  [eta %v]",
				answered, todo, qi+1, len(o.Questions), m, r.EM, r.F1, r.Contained, r.PerTokenMS, r.TTFTMS, clip(r.Answer, 60), eta.Round(time.Second))
		}
	}
	return errors.Join(device.Stop(10*time.Second), cloud.Stop(10*time.Second))
}

func appendJSON(f *os.File, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return err
}

// summarize averages the scores of the asked questions per mode.
func summarize(o Options, cfg config, done map[string]Record) Result {
	res := Result{N: len(o.Questions), K: o.K, DeviceModel: cfg.DeviceModel, CloudModel: cfg.CloudModel,
		EM: map[string]float64{}, F1: map[string]float64{}, Contained: map[string]float64{},
		PerTokenMS: map[string]float64{}, TTFTMS: map[string]float64{}, Fallbacks: map[string]int{}, Records: o.Records,
		Retrieval: cmp.Or(o.Retrieval, "auto"), Weights: cmp.Or(o.Weights, "static"), RerankCandidates: o.RerankCandidates, RescoreEvery: o.RescoreEvery,
		PosteriorEvery: o.PosteriorEvery, Confidence: o.Confidence, ClosedBook: o.ClosedBook, ClosedBookSides: o.ClosedBookSides,
		TopSourceContainsAnswer: map[string]float64{}, TopScoreContainsAnswer: map[string]float64{}, AnySourceContainsAnswer: map[string]float64{},
		SourcesCounted: map[string]int{}}
	for _, m := range o.Modes {
		var per, ttft []float64
		var em, f1, in float64
		var counted, byShare, byScore, byAny int
		for _, q := range o.Questions {
			r := done[key(q.Source, q.Line, m)]
			em, f1, in = em+r.EM, f1+r.F1, in+r.Contained
			if r.Contained > 0 && r.TopShareHasAnswer != nil && r.TopScoreHasAnswer != nil {
				counted++
				byShare += b2i(*r.TopShareHasAnswer)
				byScore += b2i(*r.TopScoreHasAnswer)
				byAny += b2i(slices.ContainsFunc(r.Sources, func(e RecordSource) bool { return e.HasAnswer }))
			}
			if r.Tokens > 1 {
				per = append(per, r.PerTokenMS)
			}
			ttft = append(ttft, r.TTFTMS)
			if r.Fallback {
				res.Fallbacks[m]++
			}
		}
		n := float64(max(len(o.Questions), 1))
		res.EM[m], res.F1[m], res.Contained[m] = em/n, f1/n, in/n
		if counted > 0 {
			res.TopSourceContainsAnswer[m] = float64(byShare) / float64(counted)
			res.TopScoreContainsAnswer[m] = float64(byScore) / float64(counted)
			res.AnySourceContainsAnswer[m] = float64(byAny) / float64(counted)
			res.SourcesCounted[m] = counted
		}
		res.PerTokenMS[m], res.TTFTMS[m] = timing.Median(per), timing.Median(ttft)
	}
	return res
}

// checkWeights checks o's weighing and clears what it does not use.
func checkWeights(o *Options) error {
	switch o.Weights {
	case "", "static", "posterior":
		o.RerankModel, o.RerankCandidates, o.RescoreEvery = "", 0, 0
	case "rerank", "dynamic", "rerank-posterior":
		if o.RerankModel == "" || o.RerankCandidates < 1 {
			return fmt.Errorf("qabench: weights %s needs a re-ranking model and candidates (got %q, %d)", o.Weights, o.RerankModel, o.RerankCandidates)
		}
		if o.Weights != "dynamic" {
			o.RescoreEvery = 0
		} else if o.RescoreEvery < 1 {
			return fmt.Errorf("qabench: weights dynamic needs a rescoring interval (got %d)", o.RescoreEvery)
		}
	default:
		return fmt.Errorf("qabench: weights %q: want static, rerank, dynamic, posterior or rerank-posterior", o.Weights)
	}
	if o.Weights == "static" {
		o.Weights = ""
	}
	if !strings.HasSuffix(o.Weights, "posterior") {
		o.PosteriorEvery = 0
	} else if o.PosteriorEvery < 1 {
		return fmt.Errorf("qabench: weights %s needs a posterior interval (got %d)", o.Weights, o.PosteriorEvery)
	}
	return nil
}

// recordSources are an answer's sources as its record keeps them, each
// tested against the gold answers on its passage's whole text (DPR's
// has-answer test; the closed-book document holds nothing).
func (o Options) recordSources(list []*dragonv1.Source, gold []string) []RecordSource {
	out := make([]RecordSource, len(list))
	for i, e := range list {
		texts, side := o.DevicePassages, "device"
		if e.GetSide() == dragonv1.Side_SIDE_CLOUD {
			texts, side = o.CloudPassages, "cloud"
		}
		r := RecordSource{Side: side, PassageID: e.GetPassageId(), ClosedBook: e.GetClosedBook(), Score: e.GetScore(), Share: e.GetShare()}
		if text, ok := texts[e.GetPassageId()]; ok && !r.ClosedBook {
			r.HasAnswer = retrievalbench.HasAnswer(text, gold)
		}
		out[i] = r
	}
	return out
}

// topSources tells whether the source of the largest share and the
// source of the highest relevance score hold a gold answer (nil, nil
// without sources).
func topSources(list []RecordSource) (byShare, byScore *bool) {
	if len(list) == 0 {
		return nil, nil
	}
	top, best := list[0], list[0]
	for _, e := range list {
		if e.Share > top.Share {
			top = e
		}
		if e.Score > best.Score {
			best = e
		}
	}
	return &top.HasAnswer, &best.HasAnswer
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func tail(s string) string {
	if len(s) > 4000 {
		return "…" + s[len(s)-4000:]
	}
	return s
}

func clip(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}
