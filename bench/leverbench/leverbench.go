// Package leverbench runs dragon bench lever: a model larger than the
// memory it is given, as on a phone (Lever, shared/papers/004). Each mode
// decodes the same prompts greedily in a process of its own inside a
// cgroup v1 memory group of the budget plus the process's own baseline,
// the model file dropped from the page cache first, so that the weights
// the budget cannot hold are read from storage again by every pass; the
// same model runs unbudgeted beside it. It reports what Lever compares:
// tokens per second, passes and bytes read from storage per token,
// accepted tokens per pass and the peak memory charged.
package leverbench

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/engine/residency"
	"github.com/dragon-rag/dragon/internal/memcgroup"
	"github.com/dragon-rag/dragon/internal/procstatus"
	"github.com/dragon-rag/dragon/specdec"
)

// Modes are the decoding modes a run compares, in order. "draft" is
// Lever's draft model kept in memory: linear drafts from the context or
// from a smaller model of the same tokenizer (Options.DraftModel), whose
// weights are locked beside the target's, the cost model choosing per
// step. "trees-draft" is Lever's whole scheme: token trees from the
// context with the draft model's greedy draft as one more branch, merged
// with them where they agree. Under half the target's weights the draft
// model's memory is taken from the target's locked weights
// (docs/BENCHMARKS.md measures what that costs).
var Modes = []string{"unbudgeted", "plain", "linear", "trees", "draft", "trees-draft"}

// Settings are what every mode's child runs with.
type Settings struct {
	Model string
	// DraftModel is the draft mode's smaller model.
	DraftModel string
	Corpus     string // the built-in prompt set's corpus folder
	Prompts    int
	MaxTokens  int
	// BudgetMB and Pin: lock what the budget holds of the weights, beside
	// the memory the child already uses and room to page a layer in.
	BudgetMB int
	// Pin locks the part of the weights the budget holds beside the rest
	// (residency.Plan) in every budgeted mode; without it the kernel's LRU
	// alone decides what stays.
	Pin bool
	// Advice is the madvise of the model's mapping in budgeted modes.
	Advice residency.Advice
	// Readers > 0 reads each layer's unpinned weights into a layer buffer
	// with that many threads (llamacpp.Prefetch) in budgeted modes; 0
	// leaves them to the pass's page faults.
	Readers int
	// FollowUps decodes held-out prompts each followed by its question
	// in other words over the same passage (promptset.WithFollowUps), and
	// the speculative modes also draft from a store of the earlier
	// answers (issue 57's related prompts): 2 × Prompts prompts.
	FollowUps bool
	// MaxDraft caps the speculative modes' drafts (0:
	// specdec.DefaultOptions's).
	MaxDraft int
	// VerifyAll verifies every draft whole, the cost model off: the most
	// tokens a pass the drafts can give, whatever the pass costs.
	VerifyAll bool
}

// Options of a run.
type Options struct {
	Settings
	// Self is the dragon binary, run once per mode as the child.
	Self  string
	Modes []string
	// Repeats runs every mode that many times, the modes in turn; a
	// mode's figures are then its median run's by tokens/s.
	Repeats int
	Log     func(format string, args ...any)
}

// Report is what dragon bench lever --json prints.
type Report struct {
	Date     string  `json:"date"`
	Model    string  `json:"model"`
	WeightMB float64 `json:"weights_mb"`
	BudgetMB int     `json:"budget_mb"`
	// BaselineMB is the child's own resident memory before it loads the
	// model: the cgroup's limit is the budget plus it.
	BaselineMB      float64         `json:"baseline_mb"`
	Prompts         int             `json:"prompts"`
	FollowUps       bool            `json:"follow_ups,omitempty"`
	MaxTokens       int             `json:"max_tokens"`
	Repeats         int             `json:"repeats"`
	GreedyIdentical bool            `json:"greedy_identical"`
	Modes           map[string]Mode `json:"modes"`
	// Differ lists the modes and prompts whose greedy output is not the
	// unbudgeted plain decoding's.
	Differ []string `json:"differ,omitempty"`
}

// Mode is one mode's figures over the prompts (decoding after the first
// token; the prefill is left out).
type Mode struct {
	TokS            float64 `json:"tok_s"`
	PassesPerToken  float64 `json:"passes_per_token"`
	ReadMBPerToken  float64 `json:"read_mb_per_token"`
	AcceptedPerPass float64 `json:"accepted_per_pass"`
	// PrunedRowsFrac is 0: early-exit pruning is not built.
	PrunedRowsFrac float64 `json:"pruned_rows_frac"`
	// PeakRSSMB is the cgroup's peak charge (page cache of the model file
	// included) under a budget, the process's peak RSS without one.
	PeakRSSMB float64 `json:"peak_rss_mb"`
	TTFTMS    float64 `json:"ttft_ms_median"`
	// PinnedMB is the target's weights locked in memory (Options.Pin).
	PinnedMB float64 `json:"pinned_mb"`
	// Readers read the rest ahead of each layer (Options.Readers).
	Readers int `json:"readers,omitempty"`
	// DraftPinnedMB is the draft model's weights locked in memory (the
	// draft mode), within the same budget.
	DraftPinnedMB float64 `json:"draft_pinned_mb,omitempty"`
	// ModelDrafted and ModelAccepted count the draft model's verified draft
	// tokens and those accepted (the draft mode; the rest of the accepted
	// tokens came from the context's drafts).
	ModelDrafted  uint64 `json:"model_drafted,omitempty"`
	ModelAccepted uint64 `json:"model_accepted,omitempty"`
	// Drafts, Drafted and Accepted count the passes that verified a
	// draft, the draft tokens verified and those accepted, every source
	// together: what bounds accepted_per_pass.
	Drafts   uint64 `json:"drafts,omitempty"`
	Drafted  uint64 `json:"drafted_tokens,omitempty"`
	Accepted uint64 `json:"accepted_tokens,omitempty"`
	// Advice is the madvise the model's mapping had.
	Advice residency.Advice `json:"advice"`
	// Refused says why the mode could not run within the budget (its
	// other figures are then empty).
	Refused string `json:"refused,omitempty"`
	// PassMS are the linear speculative modes' forward passes by their
	// rows (a one-token pass, or a verification of a draft and the token
	// before it), timed as the decoder steps: 1- and k-row passes of one
	// run interleave, so their ratio holds through a drift of the
	// storage's speed that tokens/s across runs does not.
	PassMS map[int]PassTimes `json:"pass_ms_by_rows,omitempty"`
	// TokSRuns are the tokens/s of every run of the mode, in order, when
	// it ran more than once (Options.Repeats); the other figures are the
	// median run's.
	TokSRuns []float64 `json:"tok_s_runs,omitempty"`
}

// PassTimes are the passes of one size: the slowest beside the median,
// since a pass stalled on the page cache shows in no median.
type PassTimes struct {
	Passes   int     `json:"passes"`
	MedianMS float64 `json:"median_ms"`
	MaxMS    float64 `json:"max_ms"`
}

// passTimes summarizes pass milliseconds by rows.
func passTimes(byRows map[int][]float64) map[int]PassTimes {
	if len(byRows) == 0 {
		return nil
	}
	out := make(map[int]PassTimes, len(byRows))
	for rows, ms := range byRows {
		sorted := slices.Sorted(slices.Values(ms))
		n := len(sorted)
		out[rows] = PassTimes{Passes: n, MedianMS: (sorted[(n-1)/2] + sorted[n/2]) / 2, MaxMS: sorted[n-1]}
	}
	return out
}

// medianRun is the run of median tokens/s (the lower of the middle two
// of an even count), with every run's tokens/s beside it.
func medianRun(runs []Mode) Mode {
	if len(runs) == 1 {
		return runs[0]
	}
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b Mode) int { return cmp.Compare(a.TokS, b.TokS) })
	m := sorted[(len(sorted)-1)/2]
	m.TokSRuns = make([]float64, len(runs))
	for i, r := range runs {
		m.TokSRuns[i] = r.TokS
	}
	return m
}

// childResult is what one child prints last.
type childResult struct {
	Mode    Mode             `json:"mode"`
	Outputs [][]engine.Token `json:"outputs"`
}

// Run runs every mode as a child and compares them.
func Run(ctx context.Context, o Options) (Report, error) {
	st, err := os.Stat(o.Model)
	if err != nil {
		return Report{}, fmt.Errorf("lever: the model: %w", err)
	}
	rep := Report{Date: time.Now().UTC().Format(time.RFC3339), Model: o.Model, WeightMB: mb(st.Size()), BudgetMB: o.BudgetMB,
		Prompts: o.Prompts, FollowUps: o.FollowUps, MaxTokens: o.MaxTokens, Repeats: max(o.Repeats, 1), GreedyIdentical: true, Modes: map[string]Mode{}}
	for _, mode := range o.Modes {
		if !slices.Contains(Modes, mode) {
			return rep, fmt.Errorf("lever: no mode %q (%s)", mode, strings.Join(Modes, ", "))
		}
	}
	// Rounds of every mode in turn, so that a drift of the storage's speed
	// (2× over a night on a shared VM) falls on every mode alike.
	runs := map[string][]Mode{}
	var ref [][]engine.Token
	for round := 0; round < max(o.Repeats, 1); round++ {
		for _, mode := range o.Modes {
			res, baseline, err := runChild(ctx, o, mode)
			if err != nil {
				return rep, err
			}
			if mode != "unbudgeted" {
				rep.BaselineMB = baseline
			}
			runs[mode] = append(runs[mode], res.Mode)
			if o.Log != nil {
				o.Log("lever: round %d: %s: %+v", round+1, mode, res.Mode)
			}
			if res.Mode.Refused != "" {
				continue
			}
			if ref == nil {
				ref = res.Outputs
				continue
			}
			for i := range ref {
				if i >= len(res.Outputs) || !slices.Equal(ref[i], res.Outputs[i]) {
					rep.GreedyIdentical = false
					rep.Differ = append(rep.Differ, fmt.Sprintf("%s, round %d, prompt %d", mode, round+1, i))
				}
			}
		}
	}
	for mode, rs := range runs {
		rep.Modes[mode] = medianRun(rs)
	}
	return rep, nil
}

// runChild runs one mode in a process of its own, inside a cgroup of the
// budget plus the child's baseline unless the mode is unbudgeted.
func runChild(ctx context.Context, o Options, mode string) (childResult, float64, error) {
	for _, f := range []string{o.Model, o.DraftModel} {
		if f == "" {
			continue
		}
		if err := memcgroup.DropFromPageCache(f); err != nil {
			return childResult{}, 0, err
		}
	}
	argv := []string{o.Self, "bench", "lever", "--child", mode, "--model", o.Model, "--draft-model", o.DraftModel, "--corpus", o.Corpus,
		"--n", strconv.Itoa(o.Prompts), "--follow-ups=" + strconv.FormatBool(o.FollowUps), "--max-tokens", strconv.Itoa(o.MaxTokens), "--budget-mb", strconv.Itoa(o.BudgetMB),
		"--max-draft", strconv.Itoa(o.MaxDraft), "--verify-all=" + strconv.FormatBool(o.VerifyAll),
		"--pin=" + strconv.FormatBool(o.Pin && mode != "unbudgeted"), "--readers", strconv.Itoa(o.Readers), "--advice", string(o.Advice)}
	if mode == "unbudgeted" {
		argv[len(argv)-1] = string(residency.AdviceNormal)
	}
	var cg *memcgroup.Group
	if mode != "unbudgeted" {
		var err error
		if cg, err = memcgroup.New(fmt.Sprintf("dragon-lever-%d-%s", os.Getpid(), mode)); err != nil {
			return childResult{}, 0, err
		}
		defer cg.Remove()
		argv = cg.Argv(argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return childResult{}, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return childResult{}, 0, err
	}
	if err := cmd.Start(); err != nil {
		return childResult{}, 0, fmt.Errorf("lever: start the %s child: %w", mode, err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 16<<20)
	var base struct {
		BaselineMB float64 `json:"baseline_mb"`
	}
	if !lines.Scan() {
		return childResult{}, 0, fmt.Errorf("lever: the %s child said nothing: %v", mode, lines.Err())
	}
	if err := json.Unmarshal(lines.Bytes(), &base); err != nil {
		return childResult{}, 0, fmt.Errorf("lever: the %s child's baseline: %w", mode, err)
	}
	if cg != nil {
		// The peak counts from here on: starting the binary was charged
		// before the limit.
		if err := cg.Limit(int64((float64(o.BudgetMB) + base.BaselineMB) * (1 << 20))); err != nil {
			return childResult{}, 0, err
		}
	}
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		return childResult{}, 0, err
	}
	if !lines.Scan() {
		return childResult{}, 0, fmt.Errorf("lever: the %s child ended without a result (killed at the limit?): %v", mode, lines.Err())
	}
	var res childResult
	if err := json.Unmarshal(lines.Bytes(), &res); err != nil {
		return childResult{}, 0, fmt.Errorf("lever: the %s child's result: %w", mode, err)
	}
	if cg != nil {
		peak, err := cg.Peak()
		if err != nil {
			return childResult{}, 0, err
		}
		res.Mode.PeakRSSMB = mb(peak)
	}
	return res, base.BaselineMB, nil
}

// ChildOptions are a child's: one mode.
type ChildOptions struct {
	Mode string
	Settings
}

// historyTokens is the store of earlier answers the speculative modes
// draft from with FollowUps: E5's (bench/experiments).
const historyTokens = 4096

// pinSlack is memory the child keeps free of pinned weights for what it
// allocates while decoding (the Go heap, llama.cpp's graphs).
const pinSlack = 48 << 20

// Child is one mode's process: it prints its baseline memory, waits for a
// line on in (its parent sets the cgroup's limit meanwhile), loads the
// model, decodes the prompts greedily and prints its figures.
func Child(ctx context.Context, in io.Reader, out io.Writer, o ChildOptions) error {
	spec, ok := specOf(o.Mode)
	if !ok {
		return fmt.Errorf("lever: no mode %q", o.Mode)
	}
	if spec.Enabled && o.MaxDraft > 0 {
		spec.MaxDraft = o.MaxDraft
	}
	prompts, err := promptset.BuiltIn(o.Corpus, o.Prompts, 1)
	var history *specdec.History
	if o.FollowUps {
		if prompts, err = promptset.HeldOut(o.Corpus, o.Prompts, 1); err == nil {
			prompts, err = promptset.WithFollowUps(prompts)
		}
		if err == nil && spec.Enabled {
			history, err = specdec.NewHistory(historyTokens)
		}
	}
	if err != nil {
		return err
	}
	baseline, _ := procStatus("VmRSS")
	if err := json.NewEncoder(out).Encode(map[string]float64{"baseline_mb": baseline}); err != nil {
		return err
	}
	if _, err := bufio.NewReader(in).ReadString('\n'); err != nil {
		return fmt.Errorf("lever: waiting for the parent: %w", err)
	}
	var res childResult
	// The draft model first, locked whole (but its token embeddings, read
	// a row a token): every draft token reads all of it, so a part of it
	// left to the page cache would be read from storage again and again.
	var assistant *decoder.Decoder
	var draftPinned int64
	if o.Mode == "draft" || o.Mode == "trees-draft" {
		dm, err := llamacpp.Load(o.DraftModel, llamacpp.Options{Threads: 1, InPlace: true})
		if err != nil {
			return fmt.Errorf("lever: the draft model: %w", err)
		}
		defer dm.Close()
		if assistant, err = decoder.New(dm, decoder.Options{MaxPassages: 1, CtxPerSeq: 1024, Threads: 1, BatchSize: 64}); err != nil {
			return fmt.Errorf("lever: the draft model: %w", err)
		}
		defer assistant.Close()
		p, err := residency.PinWhole(o.DraftModel)
		if err != nil {
			return fmt.Errorf("lever: the draft model: %w", err)
		}
		defer p.Unpin()
		if err := residency.AdviseRows(o.DraftModel); err != nil {
			return fmt.Errorf("lever: the draft model: %w", err)
		}
		draftPinned = p.Bytes
		res.Mode.DraftPinnedMB = mb(p.Bytes)
	}
	// In place in every mode alike, so that greedy outputs compare: the
	// repacked kernels add in another order.
	m, err := llamacpp.Load(o.Model, llamacpp.Options{Threads: 1, InPlace: true})
	if err != nil {
		return err
	}
	defer m.Close()
	// Passes of at most 64 tokens, as a device streaming its weights
	// makes them (cmd/dragon's streamUbatch), in every mode alike: the
	// logits of 512 would take 311 MiB of the budget at Qwen's vocabulary.
	dopts := decoder.Options{MaxPassages: 1, CtxPerSeq: 1024, Threads: 1, Spec: spec, BatchSize: 64, Assistant: assistant, History: history,
		NoCostModel: o.VerifyAll}
	// A decoder that measures nothing sizes the context (its KV and
	// compute buffers) first, so that what the budget leaves to locked
	// weights is measured beside it. The one that decodes is made after
	// the pin and the readers: the pass costs its cost model starts from
	// (ProfileVerify) are then those it will pay. Measured before them, on
	// a cold file, multi-row passes priced at several times a warm one-row
	// pass kept speculation off for whole runs.
	probeOpts := dopts
	probeOpts.NoCostModel, probeOpts.Assistant, probeOpts.History = true, nil, nil
	probe, err := decoder.New(m, probeOpts)
	if err != nil {
		return err
	}
	defer func() {
		if probe != nil {
			probe.Close()
		}
	}()
	// Its logits too: llama.cpp allocates them at the first pass, and
	// with the layers in buffers that cannot shrink, 37 MiB of them
	// unmeasured had the trees-draft mode killed at the cgroup's limit.
	if err := probe.Reserve(ctx); err != nil {
		return err
	}
	if err := residency.Advise(o.Model, o.Advice); err != nil {
		return err
	}
	if err := residency.AdviseRows(o.Model); err != nil {
		return err
	}
	res.Mode.Advice = o.Advice
	tensors, err := gguf.Tensors(o.Model)
	if err != nil {
		return err
	}
	var pin []gguf.Tensor
	if o.Pin {
		anon, err := procStatus("RssAnon")
		if err != nil {
			return err
		}
		_, layer := residency.Plan(tensors, 0)
		room := int64((float64(o.BudgetMB)+baseline-anon)*(1<<20)) - draftPinned - 2*layer - pinSlack
		if room < 0 && draftPinned > 0 {
			// A result, not a failure: the run's other modes stand.
			return json.NewEncoder(out).Encode(childResult{Mode: Mode{Refused: fmt.Sprintf(
				"a budget of %d MiB cannot hold the draft model's %.0f MiB beside the target's least (two layers' pages and %d MiB); the least is %.0f MiB",
				o.BudgetMB, mb(draftPinned), pinSlack>>20, float64(o.BudgetMB)-mb(room))}})
		}
		if room < residency.HeadBytes(tensors) {
			// The output head is left to the mapping's faults: what would
			// have pinned part of a layer keeps room for their readahead
			// in the page cache instead, as the device's plan does.
			room -= min(max(room, 0), residency.FaultRoom(o.Model))
		}
		pin, _ = residency.Plan(tensors, room)
		p, err := residency.Pin(o.Model, pin)
		if err != nil {
			return err
		}
		defer p.Unpin()
		res.Mode.PinnedMB = mb(p.Bytes)
	}
	// Its context goes before the model's prefetch is set: a model
	// streams into the buffers of every context or of none.
	probe.Close()
	probe = nil
	if o.Readers > 0 && o.Mode != "unbudgeted" {
		// What the pin left to storage is streamed through the layer
		// buffers of the contexts made from here on.
		reads := residency.Reads(tensors, pin, m.Layers())
		if err := m.SetPrefetch(&llamacpp.Prefetch{Ranges: reads, Readers: o.Readers}); err != nil {
			return err
		}
		res.Mode.Readers = o.Readers
	}
	passMS := map[int][]float64{}
	dopts.SpecTrace = func(e decoder.SpecEvent) {
		rows := 1
		if e.Verified {
			rows += len(e.Draft.Tokens)
		}
		passMS[rows] = append(passMS[rows], e.PassMs)
	}
	d, err := decoder.New(m, dopts)
	if err != nil {
		return err
	}
	defer d.Close()
	var tokens, steps int
	var decodeMS, readBytes float64
	var ttft []float64
	for _, p := range prompts {
		var readAtFirst int64
		first := true
		r, err := d.Generate(ctx, decoder.Request{Query: p.Query, Passages: p.Passages, MaxTokens: o.MaxTokens}, func(engine.Token, string) error {
			if first {
				readAtFirst, first = readFromStorage(), false
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("lever: %q: %w", p.Query, err)
		}
		readBytes += float64(readFromStorage() - readAtFirst)
		tokens += max(len(r.Tokens)-1, 0)
		steps += r.Steps
		res.Mode.ModelDrafted += r.Spec.ByOrigin[specdec.OriginModel].DraftedTokens
		res.Mode.ModelAccepted += r.Spec.ByOrigin[specdec.OriginModel].AcceptedTokens
		res.Mode.Drafts += r.Spec.Drafts
		res.Mode.Drafted += r.Spec.DraftedTokens
		res.Mode.Accepted += r.Spec.AcceptedTokens
		decodeMS += r.DecodeMS
		ttft = append(ttft, r.TTFTMS)
		res.Outputs = append(res.Outputs, r.Tokens)
	}
	if tokens > 0 && steps > 0 && decodeMS > 0 {
		res.Mode.TokS, res.Mode.PassesPerToken = float64(tokens)/(decodeMS/1000), float64(steps)/float64(tokens)
		res.Mode.ReadMBPerToken, res.Mode.AcceptedPerPass = readBytes/(1<<20)/float64(tokens), float64(tokens)/float64(steps)
	}
	res.Mode.PassMS = passTimes(passMS)
	slices.Sort(ttft)
	res.Mode.TTFTMS = ttft[len(ttft)/2]
	res.Mode.PeakRSSMB, _ = procStatus("VmHWM")
	return json.NewEncoder(out).Encode(res)
}

// specOf is a mode's local speculation: none, linear drafts from the
// context, or token trees from it, each under the decoder's cost model.
func specOf(mode string) (specdec.Options, bool) {
	switch mode {
	case "unbudgeted", "plain":
		return specdec.Options{}, true
	case "linear", "draft":
		return specdec.DefaultOptions(), true
	case "trees", "trees-draft":
		o := specdec.DefaultOptions()
		o.TreeBudget = specdec.DefaultTreeBudget
		return o, true
	}
	return specdec.Options{}, false
}

// readFromStorage is the bytes this process has had read from storage
// (/proc/self/io read_bytes: page cache misses, the mapped model's
// included), or 0 where the kernel does not say.
func readFromStorage() int64 {
	n, _ := procstatus.KB("/proc/self/io", "read_bytes") // bytes, not kB: the line has no unit
	return n
}

// procStatus reads a kB field of /proc/self/status, in MB.
func procStatus(field string) (float64, error) {
	kb, err := procstatus.KB(procstatus.Self, field)
	return float64(kb) / 1024, err
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }
