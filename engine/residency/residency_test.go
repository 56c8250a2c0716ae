package residency

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/internal/procstatus"
)

func TestPlan(t *testing.T) {
	mb := int64(1 << 20)
	untied := []gguf.Tensor{
		{Name: "token_embd.weight", Size: 100 * mb},
		{Name: "blk.0.attn_q.weight", Size: 10 * mb}, {Name: "blk.0.ffn_up.weight", Size: 20 * mb},
		{Name: "blk.1.attn_q.weight", Size: 10 * mb}, {Name: "blk.1.ffn_up.weight", Size: 20 * mb},
		{Name: "output_norm.weight", Size: 1}, {Name: "output.weight", Size: 150 * mb},
	}
	names := func(ts []gguf.Tensor) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Name)
		}
		return out
	}
	pin, largest := Plan(untied, 45*mb)
	assert.Equal(t, 30*mb, largest, "the largest layer")
	assert.Equal(t, []string{"blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.attn_q.weight", "output_norm.weight"}, names(pin),
		"the embeddings, read a row a token, are never pinned; what fits, in file order")
	pin, _ = Plan(untied, 0)
	assert.Empty(t, pin)
	pin, _ = Plan(untied, 181*mb)
	assert.Equal(t, []string{"output.weight", "blk.0.attn_q.weight", "blk.0.ffn_up.weight", "output_norm.weight"}, names(pin),
		"the output head first, though the file puts it last: unpinned, it would be read through the page cache")
	// Tied: the output reads the whole embedding matrix every pass.
	tied := untied[:len(untied)-1]
	pin, _ = Plan(tied, 100*mb)
	assert.Equal(t, []string{"token_embd.weight"}, names(pin))
}

func TestHeadBytes(t *testing.T) {
	untied := []gguf.Tensor{{Name: "output.weight", Size: 150}, {Name: "token_embd.weight", Size: 100}, {Name: "blk.0.a", Size: 10}}
	assert.Equal(t, int64(150), HeadBytes(untied))
	assert.Equal(t, int64(100), HeadBytes(untied[1:]), "tied: the embeddings are the head")
	assert.Zero(t, HeadBytes(untied[2:]))
}

// TestFaultRoom: four readahead windows of the file's device, as sysfs
// gives them, or of the kernel's default where there is no device.
func TestFaultRoom(t *testing.T) {
	assert.Equal(t, int64(4*128<<10), FaultRoom(filepath.Join(t.TempDir(), "absent")))
	path := filepath.Join(t.TempDir(), "m.gguf")
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(path, &st))
	dev := fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))
	b, err := os.ReadFile(dev + "/queue/read_ahead_kb")
	if err != nil {
		b, err = os.ReadFile(dev + "/../queue/read_ahead_kb") // a partition: its disk's
	}
	if err != nil {
		assert.Equal(t, int64(4*128<<10), FaultRoom(path), "no queue for the device: the default")
		return
	}
	kb, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	require.NoError(t, err)
	assert.Equal(t, 4*kb<<10, FaultRoom(path))
}

func TestReads(t *testing.T) {
	// File order as Qwen2.5's: the output first, then the layers by name.
	at := int64(0)
	tensor := func(name string, size int64) gguf.Tensor {
		t := gguf.Tensor{Name: name, Offset: at, Size: size}
		at += size
		return t
	}
	untied := []gguf.Tensor{
		tensor("output.weight", 150), tensor("token_embd.weight", 100),
		tensor("blk.0.attn_q.weight", 10), tensor("blk.0.ffn_up.weight", 20),
		tensor("blk.1.attn_q.weight", 10), tensor("blk.1.ffn_up.weight", 20),
		tensor("blk.10.attn_q.weight", 10), tensor("blk.10.ffn_up.weight", 20),
		tensor("blk.2.attn_q.weight", 10), tensor("blk.2.ffn_up.weight", 20),
		tensor("output_norm.weight", 1),
	}
	pinned := []gguf.Tensor{untied[0], untied[2], untied[5]}
	assert.Equal(t, []Read{
		{Layer: 0, Name: "blk.0.ffn_up.weight", Off: 260, Size: 20}, // blk.0's unpinned half
		{Layer: 1, Name: "blk.1.attn_q.weight", Off: 280, Size: 10}, // blk.1's
		// blk.2 before blk.10, though after it in the file
		{Layer: 2, Name: "blk.2.attn_q.weight", Off: 340, Size: 10}, {Layer: 2, Name: "blk.2.ffn_up.weight", Off: 350, Size: 20},
		{Layer: 10, Name: "blk.10.attn_q.weight", Off: 310, Size: 10}, {Layer: 10, Name: "blk.10.ffn_up.weight", Off: 320, Size: 20},
		{Layer: 11, Name: "output_norm.weight", Off: 370, Size: 1}, // after the last layer
	}, Reads(untied, pinned, 11), "the embeddings, read a row a token, are not a pass's read")
	assert.Equal(t, []Read{{Layer: 0, Name: "blk.0.attn_q.weight", Off: 250, Size: 10}, {Layer: 11, Name: "token_embd.weight", Off: 150, Size: 100}},
		Reads(untied[1:3], nil, 11), "tied (no output.weight): the embeddings are the output, read in full after the last layer")
}

// vmLocked is this process's locked memory (VmLck), in bytes.
func vmLocked(t *testing.T) int64 {
	kb, err := procstatus.KB(procstatus.Self, "VmLck")
	require.NoError(t, err)
	return kb << 10
}

// TestPinLocksTheMappedTensors: a GGUF file mapped as the engine maps it;
// Pin locks exactly the pages of the tensors asked for, Unpin lets them
// go, and a file this process has not mapped is refused.
// writeModel writes a GGUF file of float32 tensors of the given element
// counts, in order, and lists its tensors.
func writeModel(t *testing.T, tensors ...gguf.Tensor) (string, []gguf.Tensor) {
	var w gguf.Writer
	w.String("general.architecture", "llama")
	for _, x := range tensors {
		w.Tensor(x.Name, make([]float32, x.Size), uint64(x.Size))
	}
	var b bytes.Buffer
	_, err := w.WriteTo(&b)
	require.NoError(t, err)
	path := t.TempDir() + "/m.gguf"
	require.NoError(t, os.WriteFile(path, b.Bytes(), 0o644))
	ts, err := gguf.Tensors(path)
	require.NoError(t, err)
	return path, ts
}

// mapFile maps path into this process as the engine does, until the test
// ends.
func mapFile(t *testing.T, path string) []byte {
	f, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { f.Close() })
	st, err := f.Stat()
	require.NoError(t, err)
	data, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Munmap(data) })
	return data
}

func TestPinLocksTheMappedTensors(t *testing.T) {
	path, ts := writeModel(t, gguf.Tensor{Name: "blk.0.a", Size: 4096}, // 16 KiB
		gguf.Tensor{Name: "blk.0.b", Size: 8192},  // 32 KiB
		gguf.Tensor{Name: "blk.1.a", Size: 16384}) // 64 KiB

	_, err := Pin(path, ts)
	require.ErrorContains(t, err, "not mapped in this process")
	mapFile(t, path)

	before := vmLocked(t)
	p, err := Pin(path, ts[1:2]) // blk.0.b: 32 KiB, and the pages it straddles
	require.NoError(t, err)
	page := int64(os.Getpagesize())
	assert.GreaterOrEqual(t, p.Bytes, int64(32<<10))
	assert.LessOrEqual(t, p.Bytes, int64(32<<10)+2*page)
	assert.Equal(t, before+p.Bytes, vmLocked(t))
	p.Unpin()
	assert.Equal(t, before, vmLocked(t))
}

// TestAdviseLayersAdvisesOnlyTheLayersPages: random advice on the pages
// of the layers' reads splits the mapping there (smaps' VmFlags "rr"),
// and the output head's reads keep the mapping's sequential advice ("sr").
func TestAdviseLayersAdvisesOnlyTheLayersPages(t *testing.T) {
	path, ts := writeModel(t, gguf.Tensor{Name: "blk.0.a", Size: 16384}, // 64 KiB
		gguf.Tensor{Name: "output.weight", Size: 16384})
	reads := Reads(ts, nil, 1)
	require.Len(t, reads, 2)

	require.ErrorContains(t, AdviseLayers(path, AdviceRandom, reads, 1), "not mapped in this process")
	data := mapFile(t, path)

	require.NoError(t, Advise(path, AdviceSequential))
	require.Error(t, AdviseLayers(path, "sideways", reads, 1))
	require.NoError(t, AdviseLayers(path, AdviceRandom, reads, 1))
	flagsAt := func(off int64) string { return vmFlagsAt(t, data, off) }
	assert.Contains(t, flagsAt(reads[0].Off+reads[0].Size/2), " rr", "the layer's pages: random")
	assert.Contains(t, flagsAt(reads[1].Off+reads[1].Size/2), " sr", "the output head's: the mapping's sequential")
	// The mapping is now listed as parts: a tensor across two of them is
	// still found (the output head's first page is the layer's last).
	require.NotZero(t, reads[1].Off%int64(os.Getpagesize()), "the output head starts mid-page")
	p, err := Pin(path, ts)
	require.NoError(t, err)
	p.Unpin()
}

func TestAdviseRowsAdvisesOnlyTheTokenEmbeddings(t *testing.T) {
	t.Run("untied", func(t *testing.T) {
		path, ts := writeModel(t, gguf.Tensor{Name: "output.weight", Size: 16384}, // 64 KiB each
			gguf.Tensor{Name: "token_embd.weight", Size: 16384},
			gguf.Tensor{Name: "blk.0.a", Size: 16384})
		require.ErrorContains(t, AdviseRows(path), "not mapped in this process")
		data := mapFile(t, path)
		require.NoError(t, Advise(path, AdviceSequential))
		require.NoError(t, AdviseRows(path))
		for _, x := range ts {
			want := " sr"
			if x.Name == "token_embd.weight" {
				want = " rr"
			}
			assert.Contains(t, vmFlagsAt(t, data, x.Offset+x.Size/2), want, x.Name)
		}
	})
	t.Run("tied: the output reads them whole", func(t *testing.T) {
		path, ts := writeModel(t, gguf.Tensor{Name: "token_embd.weight", Size: 16384},
			gguf.Tensor{Name: "blk.0.a", Size: 16384})
		data := mapFile(t, path)
		require.NoError(t, Advise(path, AdviceSequential))
		require.NoError(t, AdviseRows(path))
		assert.Contains(t, vmFlagsAt(t, data, ts[0].Offset+ts[0].Size/2), " sr")
	})
}

// vmFlagsAt is the VmFlags line of /proc/self/smaps for the mapping that
// holds data[off] (rr: random advice, sr: sequential).
func vmFlagsAt(t *testing.T, data []byte, off int64) string {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	require.NoError(t, err)
	at := uint64(uintptr(unsafe.Pointer(&data[0]))) + uint64(off)
	var inside bool
	for _, line := range strings.Split(string(smaps), "\n") {
		if lo, hi, ok := strings.Cut(strings.Fields(line + " x")[0], "-"); ok {
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			inside = err1 == nil && err2 == nil && at >= start && at < end
		}
		if inside && strings.HasPrefix(line, "VmFlags:") {
			return line
		}
	}
	t.Fatalf("no mapping at offset %d", off)
	return ""
}
