// Package cachebench measures the KV prefix cache (`dragon bench cache`):
//
//   - TTFT: a cloud and a device daemon started fresh for each
//     configuration (device-only; dragon behind a netsim link of one-way
//     latency L, no jitter unless asked), pinned and with one thread each
//     as bench agg runs them, their caches at the defaults; every question asked cold,
//     then again warm after the others; the time to first token, the
//     passages restored, and whether warm greedy answers equal cold ones;
//   - restore: in this process, on one thread, prefilling a passage
//     sequence's prompt against loading its saved KV state;
//   - load: bench load's cloud under Zipf-distributed passages (a pool of
//     cloud passages, each retrieved first by an excerpt of it, drawn with
//     s = 1), its cache off and on, and the cache's hit rate.
package cachebench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/engine"
)

// Result is the JSON `dragon bench cache` prints.
type Result struct {
	// TTFTMS by configuration ("device-only", "dragon@0", "dragon@100"),
	// then "cold" or "warm": medians over the questions.
	TTFTMS map[string]map[string]float64 `json:"ttft_ms,omitempty"`
	// PrefillMS and RestoreMS per passage: medians (Restore has the rest).
	PrefillMS float64     `json:"prefill_ms_per_passage"`
	RestoreMS float64     `json:"restore_ms_per_passage"`
	Load      *LoadResult `json:"load,omitempty"`
	// GreedyIdentical of GreedyPrompts warm answers equal the cold ones.
	GreedyIdentical int `json:"greedy_identical"`
	GreedyPrompts   int `json:"greedy_prompts"`

	// Context.
	RestoreOverPrefill float64        `json:"restore_over_prefill"`
	TTFT               *TTFTResult    `json:"ttft,omitempty"`
	Restore            *RestoreResult `json:"restore,omitempty"`
	Questions          int            `json:"questions"`
	MaxTokens          int            `json:"max_tokens"`
	Passages           int            `json:"passages"`
	// JitterFrac is the links' jitter as a fraction of their latency.
	JitterFrac float64 `json:"jitter_frac"`
	Machine    Machine `json:"machine"`
	Date       string  `json:"date"`
	WallS      float64 `json:"wall_s"`
}

// Machine describes where the benchmark ran.
type Machine struct {
	Cores  int    `json:"cores"`
	CPU    string `json:"cpu,omitempty"`
	GOOS   string `json:"goos"`
	GOARCH string `json:"goarch"`
}

// ThisMachine describes this machine.
func ThisMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), GOOS: runtime.GOOS, GOARCH: runtime.GOARCH}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// Options of a whole run: the parts to run (a nil part is skipped).
type Options struct {
	TTFT    *TTFTOptions
	Restore *RestorePart
	Load    *LoadOptions
	Log     func(format string, args ...any)
}

// RestorePart configures the restore measurement: the model (loaded with
// Threads threads), the prompts whose passages to measure, Repeats of
// each, and the core to pin this process to while it measures ("" leaves
// it where it is; afterwards it may run on every core).
type RestorePart struct {
	Model   engine.Model
	Prompts []promptset.Prompt
	Repeats int
	Threads int
	Core    string
}

// Run runs the parts in order restore, TTFT, load.
func Run(ctx context.Context, o Options) (Result, error) {
	start := time.Now()
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	res := Result{Machine: ThisMachine(), Date: start.UTC().Format(time.RFC3339)}
	if o.Restore != nil {
		if o.Restore.Core != "" {
			if err := Pin(o.Restore.Core); err != nil {
				return res, err
			}
		}
		prompts, err := PassagePrompts(ctx, o.Restore.Model, o.Restore.Prompts)
		if err != nil {
			return res, err
		}
		o.Log("restore: %d passage prompts", len(prompts))
		r, err := MeasureRestore(ctx, o.Restore.Model, prompts, o.Restore.Repeats, o.Restore.Threads)
		if err != nil {
			return res, err
		}
		r.Core = o.Restore.Core
		res.Restore = &r
		res.PrefillMS, res.RestoreMS, res.RestoreOverPrefill = r.PrefillMS, r.RestoreMS, r.Ratio
		o.Log("restore: prefill %.2f ms, restore %.3f ms per passage (%.3f×)", r.PrefillMS, r.RestoreMS, r.Ratio)
		if o.Restore.Core != "" {
			if err := Pin(AllCores()); err != nil {
				return res, err
			}
		}
	}
	if o.TTFT != nil {
		t, err := RunTTFT(ctx, *o.TTFT)
		if err != nil {
			return res, err
		}
		res.TTFT = &t
		res.TTFTMS = t.TTFTMS
		res.GreedyIdentical, res.GreedyPrompts = t.GreedyIdentical, t.GreedyPrompts
		res.Questions, res.MaxTokens, res.Passages = len(o.TTFT.Questions), o.TTFT.MaxTokens, o.TTFT.Passages
		for _, c := range o.TTFT.Configs {
			if c.LatencyMS > 0 {
				res.JitterFrac = c.JitterMS / c.LatencyMS
			}
		}
	}
	if o.Load != nil {
		l, err := RunLoad(ctx, *o.Load)
		if err != nil {
			return res, err
		}
		res.Load = &l
	}
	res.WallS = time.Since(start).Seconds()
	return res, nil
}

// Pin moves this process, all its threads, to cores (a taskset list;
// nothing when taskset is missing).
func Pin(cores string) error {
	ts, err := exec.LookPath("taskset")
	if err != nil {
		return nil
	}
	if out, err := exec.Command(ts, "-a", "-p", "-c", cores, strconv.Itoa(os.Getpid())).CombinedOutput(); err != nil {
		return fmt.Errorf("cachebench: taskset: %v: %s", err, out)
	}
	return nil
}

// AllCores is the taskset list of every core.
func AllCores() string { return "0-" + strconv.Itoa(runtime.NumCPU()-1) }

// WriteTable prints the result for people.
func WriteTable(w io.Writer, r Result) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "bench cache, %s, %d cores (%s)\t\n", r.Date, r.Machine.Cores, r.Machine.CPU)
	if r.TTFT != nil {
		fmt.Fprintf(tw, "\nTTFT (ms, median of %d questions, %d passages per side)\tcold\twarm\twarm/cold\trestored cold\trestored warm\t\n", r.Questions, r.Passages)
		for _, name := range sortedConfigs(r.TTFTMS) {
			t := r.TTFTMS[name]
			ratio := 0.0
			if t["cold"] > 0 {
				ratio = t["warm"] / t["cold"]
			}
			rf := r.TTFT.RestoredFraction[name]
			fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.2f\t%.0f%%\t%.0f%%\t\n", name, t["cold"], t["warm"], ratio, 100*rf["cold"], 100*rf["warm"])
		}
		fmt.Fprintf(tw, "greedy warm = cold\t%d/%d\t\t\t\t\t\n", r.GreedyIdentical, r.GreedyPrompts)
	}
	if r.Restore != nil {
		fmt.Fprintf(tw, "\nper passage (median, %d passages × %d, %d-token prompts)\tms\t\n", r.Restore.Passages, r.Restore.Repeats, int(r.Restore.PromptTokens))
		fmt.Fprintf(tw, "prefill\t%.2f\t\n", r.PrefillMS)
		fmt.Fprintf(tw, "restore\t%.3f\t\n", r.RestoreMS)
		fmt.Fprintf(tw, "restore / prefill\t%.3f\t\n", r.RestoreOverPrefill)
	}
	if l := r.Load; l != nil {
		fmt.Fprintf(tw, "\nload (Zipf s=%g over %d passages, %d requests × %d tokens per client)\ttok/s off\ttok/s on\ton/off\thit rate\t\n", l.ZipfS, l.Pool, l.Requests, l.MaxTokens)
		keys := make([]string, 0, len(l.TokSOff))
		for k := range l.TokSOff {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool { a, _ := strconv.Atoi(keys[i]); b, _ := strconv.Atoi(keys[j]); return a < b })
		for _, k := range keys {
			ratio := 0.0
			if l.TokSOff[k] > 0 {
				ratio = l.TokSOn[k] / l.TokSOff[k]
			}
			fmt.Fprintf(tw, "%s clients\t%.1f\t%.1f\t%.2f\t%.0f%%\t\n", k, l.TokSOff[k], l.TokSOn[k], ratio, 100*l.HitRateBy[k])
		}
		fmt.Fprintf(tw, "all\t\t\t\t%.0f%%\t\n", 100*l.HitRate)
	}
	fmt.Fprintf(tw, "\nwall time\t%.0f s\t\n", r.WallS)
	return tw.Flush()
}

// sortedConfigs orders configuration names: device-only first, then
// dragon by latency.
func sortedConfigs(m map[string]map[string]float64) []string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	lat := func(n string) float64 {
		_, l, ok := strings.Cut(n, "@")
		if !ok {
			return -1
		}
		v, _ := strconv.ParseFloat(l, 64)
		return v
	}
	sort.Slice(names, func(i, j int) bool {
		if a, b := lat(names[i]), lat(names[j]); a != b {
			return a < b
		}
		return names[i] < names[j]
	})
	return names
}
