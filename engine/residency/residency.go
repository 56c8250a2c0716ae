// Package residency keeps chosen tensors of a memory-mapped model file in
// memory while the rest of the file is left to the kernel, for a model
// larger than the memory it is given (Lever, shared/papers/004): a
// forward pass reads every layer in turn, so under a memory limit the
// kernel's LRU evicts each layer just before the next pass needs it and
// every pass reads the whole file again. Locking a part of it that fits
// leaves only the rest to be read, once a pass.
package residency

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/dragon-rag/dragon/engine/gguf"
)

// tokenEmbeddings is read a row per token, not in full by every pass: it
// gains nothing from being pinned (unless the output shares it, in which
// case the file has no output.weight of its own).
const tokenEmbeddings = "token_embd.weight"

// Plan picks the tensors to pin within budget bytes: those every pass
// reads in full, each whole, the output projection first, then in file
// order. Every such byte saves the same read a pass, but an unpinned layer
// is read into the layer buffers (llamacpp.Prefetch) while the output head
// is read by the pass's faults through the page cache, which a tight
// budget leaves small (FaultRoom). Qwen2.5's files put the output
// projection first anyway, then the layers by name (blk.0, blk.1, blk.10,
// ...). It also returns the largest layer's bytes (blk.N), the room the
// kernel needs to page an unpinned layer in.
func Plan(tensors []gguf.Tensor, budget int64) (pin []gguf.Tensor, largestLayer int64) {
	tied := tiedOutput(tensors)
	layers := map[string]int64{}
	for _, t := range tensors {
		if l, ok := layerOf(t.Name); ok {
			layers[l] += t.Size
		}
	}
	for _, n := range layers {
		largestLayer = max(largestLayer, n)
	}
	head := "output.weight"
	if tied {
		head = tokenEmbeddings
	}
	ordered := slices.Clone(tensors)
	if i := slices.IndexFunc(ordered, func(t gguf.Tensor) bool { return t.Name == head }); i > 0 {
		ordered = slices.Insert(slices.Delete(ordered, i, i+1), 0, tensors[i])
	}
	used := int64(0)
	for _, t := range ordered {
		if t.Name == tokenEmbeddings && !tied {
			continue
		}
		if used+t.Size > budget {
			continue
		}
		pin = append(pin, t)
		used += t.Size
	}
	return pin, largestLayer
}

// tiedOutput says whether the model has no output.weight of its own, its
// output projection being the token embeddings.
func tiedOutput(tensors []gguf.Tensor) bool {
	return !slices.ContainsFunc(tensors, func(t gguf.Tensor) bool { return t.Name == "output.weight" })
}

// layerOf is a tensor's layer ("blk.7"), if it is in one.
func layerOf(name string) (string, bool) {
	if rest, ok := strings.CutPrefix(name, "blk."); ok {
		if i := strings.IndexByte(rest, '.'); i > 0 {
			return "blk." + rest[:i], true
		}
	}
	return "", false
}

// HeadBytes is the size of the output projection, which every pass reads
// whole: output.weight, or the token embeddings a model ties to it.
func HeadBytes(tensors []gguf.Tensor) int64 {
	var embeddings int64
	for _, t := range tensors {
		switch t.Name {
		case "output.weight":
			return t.Size
		case tokenEmbeddings:
			embeddings = t.Size
		}
	}
	return embeddings
}

// faultWindows is how many of the device's readahead windows an unpinned
// output head wants in the page cache. Its faults read it under
// sequential advice a window at a time, the next window read before the
// last is used up. Measured on the Zen 5 VM (read_ahead_kb 8192) with the
// 1.5B's head (182 MiB) faulted in under a cgroup limit beside a locked
// draft model: with about 20 MiB of file pages left that the cgroup could
// reclaim, windows evicted each other before they were read, and in 5
// runs of 11 a pass re-read tens of GB over a minute; with four windows
// more (about 55 MiB) none did in 5 runs.
const faultWindows = 4

// defaultReadahead is the kernel's readahead where the file's device does
// not say (VM_READAHEAD_PAGES: 128 KiB).
const defaultReadahead = 128 << 10

// FaultRoom is the page cache, in bytes, that a streamed plan leaves to an
// output head it cannot pin: faultWindows readahead windows of the block
// device holding path (its queue/read_ahead_kb).
func FaultRoom(path string) int64 {
	return faultWindows * readahead(path)
}

// readahead is the readahead of path's block device in bytes (that of
// the disk, for a partition), or the kernel's default where sysfs does not
// list one (tmpfs, overlay, a container without /sys).
func readahead(path string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return defaultReadahead
	}
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	for _, f := range []string{dev + "/queue/read_ahead_kb", dev + "/../queue/read_ahead_kb"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if kb, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && kb > 0 {
			return kb << 10
		}
	}
	return defaultReadahead
}

// Pinned is a set of locked ranges of the process's mapping of a file.
type Pinned struct {
	ranges [][2]uintptr
	Bytes  int64
}

// Pin locks the pages of tensors in this process's mapping of path (the
// one the engine made when it loaded the model), reading them in now.
// Locking needs the right (CAP_IPC_LOCK, or RLIMIT_MEMLOCK room); without
// it Pin fails and nothing stays locked.
func Pin(path string, tensors []gguf.Tensor) (*Pinned, error) {
	maps, err := mappingsOf(path)
	if err != nil {
		return nil, err
	}
	page := uintptr(os.Getpagesize())
	p := &Pinned{}
	for _, t := range tensors {
		addr, ok := addressOf(maps, t.Offset, t.Size)
		if !ok {
			p.Unpin()
			return nil, fmt.Errorf("residency: tensor %s (bytes %d-%d of %s) is not mapped here", t.Name, t.Offset, t.Offset+t.Size, path)
		}
		start := addr &^ (page - 1)
		end := (addr + uintptr(t.Size) + page - 1) &^ (page - 1)
		if _, _, e := syscall.Syscall(syscall.SYS_MLOCK, start, end-start, 0); e != 0 {
			p.Unpin()
			return nil, fmt.Errorf("residency: lock tensor %s (%d MiB): %w", t.Name, t.Size>>20, e)
		}
		p.ranges = append(p.ranges, [2]uintptr{start, end})
		p.Bytes += int64(end - start)
	}
	return p, nil
}

// PinWhole locks every tensor of path that a pass reads in full (all but
// token embeddings the output does not share): a draft model, every
// token of which reads it whole.
func PinWhole(path string) (*Pinned, error) {
	tensors, err := gguf.Tensors(path)
	if err != nil {
		return nil, err
	}
	all, _ := Plan(tensors, math.MaxInt64)
	return Pin(path, all)
}

// Unpin unlocks what Pin locked.
func (p *Pinned) Unpin() {
	for _, r := range p.ranges {
		_, _, _ = syscall.Syscall(syscall.SYS_MUNLOCK, r[0], r[1]-r[0], 0)
	}
	p.ranges, p.Bytes = nil, 0
}

// Advice is how the kernel should expect the unpinned weights to be read
// (madvise).
type Advice string

// The advice Advise takes: the kernel's default readahead, sequential
// (read further ahead and drop pages soon after they are read), or random
// (no readahead: only the pages touched).
const (
	AdviceNormal     Advice = "normal"
	AdviceSequential Advice = "sequential"
	AdviceRandom     Advice = "random"
)

// Advise gives the kernel advice on this process's whole mapping of path.
func Advise(path string, a Advice) error {
	f, maps, err := adviceOn(path, a)
	if err != nil {
		return err
	}
	for _, m := range maps {
		if err := madvise(m.start, m.end, f, a); err != nil {
			return err
		}
	}
	return nil
}

// AdviseLayers gives the kernel advice on the pages of those reads that
// belong to a layer below layers: what llamacpp.Prefetch reads into its
// layer buffers, whose pages the mapping's faults touch only for the odd
// small tensor. The output head's reads (Layer == layers) keep the
// mapping's advice.
func AdviseLayers(path string, a Advice, reads []Read, layers int) error {
	f, maps, err := adviceOn(path, a)
	if err != nil {
		return err
	}
	for _, r := range reads {
		if r.Layer >= layers {
			continue
		}
		if err := adviseRange(maps, f, a, r.Name, r.Off, r.Size); err != nil {
			return err
		}
	}
	return nil
}

// AdviseRows advises random reads on this process's mapping of path's
// token embeddings, which a pass reads a row a token, unless the output
// shares them (and reads them whole). Without it a row's page fault reads
// ahead or around it as far as the device's read_ahead_kb (8 MiB on this
// project's VMs) into the little page cache a tight budget leaves, beside
// an output head the plan could not pin. It takes a few MB a token off
// the reads (plain at 560 MiB: 545–550 MB a token against 555–556); the
// stalls of that head's faults are FaultRoom's to prevent.
func AdviseRows(path string) error {
	tensors, err := gguf.Tensors(path)
	if err != nil {
		return err
	}
	i := slices.IndexFunc(tensors, func(t gguf.Tensor) bool { return t.Name == tokenEmbeddings })
	if i < 0 || tiedOutput(tensors) {
		return nil
	}
	f, maps, err := adviceOn(path, AdviceRandom)
	if err != nil {
		return err
	}
	return adviseRange(maps, f, AdviceRandom, tensors[i].Name, tensors[i].Offset, tensors[i].Size)
}

// adviseRange advises a on the pages that hold [off, off+size) of the
// mapped file.
func adviseRange(maps []mapping, flag uintptr, a Advice, name string, off, size int64) error {
	at, ok := addressOf(maps, off, size)
	if !ok {
		return fmt.Errorf("residency: %s [%d, %d) is not mapped", name, off, off+size)
	}
	page := uintptr(os.Getpagesize())
	return madvise(at&^(page-1), (at+uintptr(size)+page-1)&^(page-1), flag, a)
}

// adviceOn is a's madvise flag and this process's mappings of path.
func adviceOn(path string, a Advice) (uintptr, []mapping, error) {
	flag := map[Advice]uintptr{AdviceNormal: syscall.MADV_NORMAL, AdviceSequential: syscall.MADV_SEQUENTIAL, AdviceRandom: syscall.MADV_RANDOM}
	f, ok := flag[a]
	if !ok {
		return 0, nil, fmt.Errorf("residency: no advice %q (normal, sequential, random)", a)
	}
	maps, err := mappingsOf(path)
	return f, maps, err
}

func madvise(start, end, flag uintptr, a Advice) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MADVISE, start, end-start, flag); e != 0 {
		return fmt.Errorf("residency: madvise %s: %w", a, e)
	}
	return nil
}

// mapping is one line of /proc/self/maps for the file.
type mapping struct {
	start, end uintptr
	offset     int64
}

// mappingsOf lists this process's mappings of path.
func mappingsOf(path string) ([]mapping, error) {
	abs, err := filepath.EvalSymlinks(path)
	if err == nil {
		abs, err = filepath.Abs(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 7f..-7f.. r--p 00000000 08:01 1234   /path/to/model.gguf
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != abs {
			continue
		}
		lo, hi, _ := strings.Cut(fields[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		off, err3 := strconv.ParseInt(fields[2], 16, 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("residency: /proc/self/maps: %q: %w", sc.Text(), err)
		}
		out = append(out, mapping{start: uintptr(start), end: uintptr(end), offset: off})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("residency: /proc/self/maps: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("residency: %s is not mapped in this process", abs)
	}
	return out, nil
}

// addressOf is where bytes [off, off+size) of the file lie in one mapping.
// The kernel lists a mapping as several where parts of it were locked or
// advised apart, so the range's first and last bytes may lie in two of
// them: they must then be the same mapping's, at addresses size-1 apart.
func addressOf(maps []mapping, off, size int64) (uintptr, bool) {
	at := func(o int64) (uintptr, bool) {
		for _, m := range maps {
			if o >= m.offset && o < m.offset+int64(m.end-m.start) {
				return m.start + uintptr(o-m.offset), true
			}
		}
		return 0, false
	}
	first, ok1 := at(off)
	last, ok2 := at(off + size - 1)
	if !ok1 || !ok2 || last-first != uintptr(size-1) {
		return 0, false
	}
	// Every page between them is mapped too (no hole where a part of
	// the mapping was unmapped).
	page := int64(os.Getpagesize())
	for o := (off/page + 1) * page; o < off+size-1; o += page {
		if a, ok := at(o); !ok || a-first != uintptr(o-off) {
			return 0, false
		}
	}
	return first, true
}

// Read is a tensor of the model file that one layer of every pass reads
// from storage: Layer is the transformer layer (blk.N), or layers for what
// runs after the last of them (the output head).
type Read struct {
	Layer     int
	Name      string
	Off, Size int64
}

// Reads lists what a pass reads from storage once pinned is locked: every
// other tensor but the token embeddings (read a row a token; in full only
// as the output of a model that ties them), by the layer that reads it,
// in layer order and, within a layer, in file order.
func Reads(tensors, pinned []gguf.Tensor, layers int) []Read {
	locked := map[string]bool{}
	for _, t := range pinned {
		locked[t.Name] = true
	}
	tied := tiedOutput(tensors)
	var out []Read
	for _, t := range tensors {
		if locked[t.Name] || (t.Name == tokenEmbeddings && !tied) {
			continue
		}
		l := layers
		if name, ok := layerOf(t.Name); ok {
			n, err := strconv.Atoi(strings.TrimPrefix(name, "blk."))
			if err != nil || n >= layers {
				continue // not a layer this model runs
			}
			l = n
		}
		out = append(out, Read{Layer: l, Name: t.Name, Off: t.Offset, Size: t.Size})
	}
	slices.SortStableFunc(out, func(a, b Read) int { return cmp.Or(cmp.Compare(a.Layer, b.Layer), cmp.Compare(a.Off, b.Off)) })
	return out
}
