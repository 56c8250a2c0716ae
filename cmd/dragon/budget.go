package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/procstatus"
)

// planUbatch is the most tokens of one forward pass: the decoder's default
// batch, which engine/llamacpp also caps its graphs at.
const planUbatch = 512

// streamUbatch is the most tokens of one pass when the weights are
// streamed: the logits of a pass take ubatch × vocab × 4 bytes of the
// budget (311 MiB at 512 for a vocabulary of 152k), and a prompt prefilled
// in more passes costs little more where every pass reads the weights.
const streamUbatch = 64

// streamSlack is room a streamed plan leaves beside two layers' pages for
// what the daemon allocates while it runs (the Go heap, llama.cpp's graphs).
const streamSlack = 48 << 20

// memoryPlan is how a --memory-mb budget is spent, in bytes.
type memoryPlan struct {
	Weights int64 // the model's tensors, mapped from the file
	Compute int64 // llama.cpp's scratch for one forward pass (estimate)
	Cache   int64 // --kv-cache-mb, the prefix cache's host memory
	KV      int64 // the context's K and V: Sequences × ctx positions
	// Sequences is how many passage sequences of --ctx positions the
	// context holds: --max-passages, or fewer when the budget says so.
	Sequences int
	// Streamed: the weights do not fit beside the rest, so passes of at
	// most Ubatch tokens read them from the file, Pinned bytes of them
	// locked in memory (engine/residency) and room for two layers' pages
	// (Window) left to the kernel.
	Streamed       bool
	Ubatch         int
	Pinned, Window int64
	// HeadRoom is the part of Window left to the faults' readahead of an
	// output head that is not pinned (streamShape.HeadFaults at most).
	HeadRoom int64
	// Draft is what a draft model (--draft-model) takes: its weights, kept
	// in memory whole (locked when the target's are streamed), its compute
	// and its KV for as many sequences as the target's (KV is the
	// target's alone).
	Draft int64
}

// planMemory sizes the decoder's context to a budget:
//
//	KV room   = budget − weights − compute − prefix cache
//	sequences = min(maxPassages, ⌊KV room / (ctx × KV bytes per token)⌋)
//
// with KV bytes per token = layers × KV heads × (K + V head dims) × 2
// (f16), and compute = ubatch × (vocab + heads × ctx) × 4: the logits of
// a full pass and one layer's attention scores (no flash attention),
// which bound llama.cpp's compute buffer from above (98 MiB measured for
// SmolLM2-135M at ctx 1024 against 114 MiB estimated). The Go runtime,
// the index and an embedding model are not counted.
//
// When the weights do not fit, the plan streams them (Lever): passes of
// streamUbatch tokens, so compute shrinks, and
//
//	pinned = budget − compute − prefix cache − KV − 2 × the largest layer − slack
//
// of the weights are locked in memory, the rest read from the file by
// every pass. When that cannot hold the output head, the head runs from
// the mapping's faults, and up to shape.HeadFaults of pinned is left to
// the page cache for their readahead. It fails when even that cannot
// hold one sequence, naming the least budget that can.
//
// A draft model (draft.Weights > 0) is kept in memory whole beside it:
// its weights and compute are taken from the budget first, and each
// sequence also costs the draft's KV, since it holds the same passages.
func planMemory(budget int64, fp, draft llamacpp.Footprint, ctx, maxPassages int, cache int64, shape streamShape) (memoryPlan, error) {
	compute := func(f llamacpp.Footprint, ubatch int) int64 { return int64(ubatch) * int64(f.Vocab+f.Heads*ctx) * 4 }
	drafted := draft.Weights > 0
	draftFixed := func(ubatch int) int64 {
		if !drafted {
			return 0
		}
		return draft.Weights + compute(draft, ubatch)
	}
	p := memoryPlan{Weights: fp.Weights, Compute: compute(fp, planUbatch), Cache: cache, Ubatch: planUbatch}
	perSeq := int64(ctx) * fp.KVPerToken
	draftSeq := int64(ctx) * draft.KVPerToken
	fits := func(fixed int64) {
		p.Sequences = int(min(int64(maxPassages), (budget-fixed)/(perSeq+draftSeq)))
		p.KV = int64(p.Sequences) * perSeq
		p.Draft = draftFixed(p.Ubatch) + int64(p.Sequences)*draftSeq
	}
	if fixed := p.Weights + p.Compute + p.Cache + draftFixed(planUbatch); budget-fixed >= perSeq+draftSeq {
		fits(fixed)
		return p, nil
	}
	p.Streamed, p.Ubatch, p.Compute = true, streamUbatch, compute(fp, streamUbatch)
	p.Window = 2*shape.LargestLayer + streamSlack
	fixed := p.Compute + p.Cache + p.Window + draftFixed(streamUbatch)
	if budget-fixed < perSeq+draftSeq {
		var withDraft string
		if drafted {
			withDraft = fmt.Sprintf(", the draft model kept whole (%d MiB of weights and compute, %d MiB of KV a sequence)", mib(draftFixed(streamUbatch)), mib(draftSeq))
		}
		return p, fmt.Errorf("--memory-mb %d cannot hold one passage sequence even with the weights (%d MiB) streamed from the file: compute %d MiB (passes of %d tokens), --kv-cache-mb %d MiB, one sequence of --ctx %d positions %d MiB (%d bytes per position) and room for two layers' pages %d MiB%s; give at least --memory-mb %d, or lower --ctx or --kv-cache-mb",
			budget>>20, mib(p.Weights), mib(p.Compute), p.Ubatch, mib(p.Cache), ctx, mib(perSeq), fp.KVPerToken, mib(p.Window), withDraft, mib(fixed+perSeq+draftSeq))
	}
	fits(fixed)
	p.Pinned = min(budget-p.Compute-p.Cache-p.Window-p.KV-p.Draft, p.Weights)
	if p.Pinned < shape.Head {
		// The output head is not pinned, so the pass's faults read it
		// through the page cache: what would have pinned part of a layer
		// keeps room for their readahead instead.
		p.HeadRoom = min(p.Pinned, shape.HeadFaults)
		p.Window += p.HeadRoom
		p.Pinned -= p.HeadRoom
	}
	return p, nil
}

// streamShape is what a streamed plan needs to know of the model file
// (engine/residency).
type streamShape struct {
	// LargestLayer is the bytes of the largest layer, two of which the
	// plan keeps room for.
	LargestLayer int64
	// Head is the output projection's bytes, which every pass reads
	// whole; HeadFaults is the page cache its faults want when the plan
	// cannot pin it (residency.FaultRoom).
	Head, HeadFaults int64
}

// mib rounds bytes up to MiB.
func mib(b int64) int64 { return (b + 1<<20 - 1) >> 20 }

// defaultThreads is --threads' default. Phones have big.LITTLE CPUs,
// whose cores differ in top frequency: there the daemon uses the cores
// faster than the slowest cluster (the prime and performance cores: a
// thread on a little core makes every pass wait for it), leaving at least
// one core to the phone's own work. On a CPU whose cores are alike, or
// whose frequencies sysfs does not show (VMs), one thread, as before:
// the benchmarks pin each daemon to a core.
func defaultThreads(cpuDir string, ncpu int) int {
	paths, _ := filepath.Glob(filepath.Join(cpuDir, "cpu[0-9]*", "cpufreq", "cpuinfo_max_freq"))
	var freqs []int64
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // an offline core
		}
		if f, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && f > 0 {
			freqs = append(freqs, f)
		}
	}
	if len(freqs) < 2 {
		return 1
	}
	slowest := freqs[0]
	for _, f := range freqs {
		slowest = min(slowest, f)
	}
	big := 0
	for _, f := range freqs {
		if f > slowest {
			big++
		}
	}
	if big == 0 {
		return 1
	}
	return max(1, min(big, min(ncpu, len(freqs))-1))
}

// registerResidentMemory exports the daemon's resident memory, now and
// at its peak, from /proc/self/status (VmRSS, VmHWM): what a phone's
// low-memory killer looks at. The peak includes the weights' mapped
// pages that were read.
func registerResidentMemory(reg prometheus.Registerer, status string) {
	read := func(key string) func() float64 {
		return func() float64 {
			v, err := procstatus.KB(status, key)
			if err != nil {
				return 0
			}
			return float64(v) * 1024
		}
	}
	reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dragon_resident_memory_bytes", Help: "Resident memory of the daemon (VmRSS), mapped model pages included."}, read("VmRSS")),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dragon_resident_memory_peak_bytes", Help: "Peak resident memory of the daemon since it started (VmHWM)."}, read("VmHWM")),
	)
}
