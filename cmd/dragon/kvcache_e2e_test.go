package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
)

// TestRealKVCacheAnswersEqualUncached: two daemon pairs, one without KV
// caches and one with them (memory and disk), answer the same questions in
// device-only, cloud-only and dragon mode, greedily: asked the first time,
// again after the others, again after both cached daemons restarted (warm
// from disk), and as the second turn of a chat, the cached pair's answers
// equal the uncached pair's token for token, and its summaries say the
// warm ones restored every passage of the sides that decode.
func TestRealKVCacheAnswersEqualUncached(t *testing.T) {
	off := []string{"--kv-cache-mb", "0"}
	ref, refDev, refCld := pairWith(t, 0, off, off, nil)
	cloudDir, deviceDir := t.TempDir(), t.TempDir()
	cloudArgs, deviceArgs := []string{"--kv-cache-dir", cloudDir}, []string{"--kv-cache-dir", deviceDir}
	cached, dev, cld := pairWith(t, 0, cloudArgs, deviceArgs, nil)

	modes := []dragonv1.Mode{dragonv1.Mode_MODE_DEVICE_ONLY, dragonv1.Mode_MODE_CLOUD_ONLY, dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
	questions := promptset.Questions[:2]
	request := func(q string, mode dragonv1.Mode, history []*dragonv1.ChatTurn) *dragonv1.GenerateRequest {
		return &dragonv1.GenerateRequest{Prompt: q, Mode: mode, History: history, Sampling: &dragonv1.SamplingParams{MaxTokens: 16}}
	}
	type key struct {
		mode dragonv1.Mode
		q    int
	}
	want := map[key]aggbench.Answer{}
	for _, mode := range modes {
		for i, q := range questions {
			a, err := ask(t, ref, request(q, mode, nil))
			require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", refDev.Logs(), refCld.Logs())
			want[key{mode, i}] = a
		}
	}
	// restored checks that a warm answer restored every passage of the
	// sides that decoded it.
	restored := func(stage string, mode dragonv1.Mode, s *dragonv1.GenerateSummary) {
		t.Helper()
		if mode != dragonv1.Mode_MODE_CLOUD_ONLY {
			assert.Equal(t, s.GetPassagesDevice(), s.GetPassagesRestoredDevice(), "%s, %v: device passages restored", stage, mode)
		}
		if mode != dragonv1.Mode_MODE_DEVICE_ONLY {
			assert.Equal(t, s.GetPassagesCloud(), s.GetPassagesRestoredCloud(), "%s, %v: cloud passages restored", stage, mode)
		}
	}
	pass := func(stage string, client dragonv1.DeviceServiceClient, warm bool) {
		t.Helper()
		for _, mode := range modes {
			for i, q := range questions {
				a, err := ask(t, client, request(q, mode, nil))
				require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
				assert.Equal(t, want[key{mode, i}].Tokens, a.Tokens, "%s, %v, question %d: %q\nwant %q\ngot  %q", stage, mode, i, q, want[key{mode, i}].Text, a.Text)
				if warm {
					restored(stage, mode, a.Summary)
				}
			}
		}
	}
	pass("cold", cached, false)
	pass("warm", cached, true)

	// Restart the cached pair on the same cache folders: warm from disk.
	require.NoError(t, dev.Stop(30*time.Second))
	require.NoError(t, cld.Stop(30*time.Second))
	for _, dir := range []string{cloudDir, deviceDir} {
		entries, err := filepath.Glob(filepath.Join(dir, "*.kv"))
		require.NoError(t, err)
		assert.NotEmpty(t, entries, "%s holds cache entries", dir)
	}
	cached, dev, cld = pairWith(t, 0, cloudArgs, deviceArgs, nil)
	pass("restarted", cached, true)

	// The second turn of each chat asks the question again (so that both
	// sides retrieve the same passages) after the first turn's answer.
	for _, mode := range modes {
		for i, q := range questions {
			first := want[key{mode, i}]
			history := []*dragonv1.ChatTurn{{Role: dragonv1.ChatRole_CHAT_ROLE_USER, Content: q}, {Role: dragonv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: first.Text}}
			w, err := ask(t, ref, request(q, mode, history))
			require.NoError(t, err)
			// The first turn again on the cached pair, as a chat would have
			// asked it, then the second.
			_, err = ask(t, cached, request(q, mode, nil))
			require.NoError(t, err)
			a, err := ask(t, cached, request(q, mode, history))
			require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
			assert.Equal(t, w.Tokens, a.Tokens, "second turn, %v, question %d: %q\nwant %q\ngot  %q", mode, i, q, w.Text, a.Text)
			restored("second turn", mode, a.Summary)
		}
	}
}

// capture is a TCP proxy that keeps every byte it forwards, both ways.
type capture struct {
	ln  net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
	wg  sync.WaitGroup
}

func newCapture(t *testing.T, upstream string) *capture {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	c := &capture{ln: ln}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", upstream)
			if err != nil {
				in.Close()
				continue
			}
			c.wg.Add(2)
			go c.pump(out, in)
			go c.pump(in, out)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
	})
	return c
}

func (c *capture) pump(dst, src net.Conn) {
	defer c.wg.Done()
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			c.mu.Lock()
			c.buf.Write(buf[:n])
			c.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				_ = src.Close()
			}
			return
		}
	}
}

func (c *capture) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

// TestRealDeviceCacheStaysOnTheDevice: everything the device and the cloud
// said to each other while the device answered from its KV cache, captured
// on the wire, holds none of the device's cached KV bytes and none of its
// passages' text.
func TestRealDeviceCacheStaysOnTheDevice(t *testing.T) {
	deviceDir := t.TempDir()
	var wire *capture
	client, dev, cld := pairWith(t, 0, nil, []string{"--kv-cache-dir", deviceDir}, func(addr string) string {
		wire = newCapture(t, addr)
		return wire.ln.Addr().String()
	})
	q := promptset.DemoQuestion
	for range 2 { // cold, then warm from the cache
		a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: q, Sampling: &dragonv1.SamplingParams{MaxTokens: 16}})
		require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
		require.NotEmpty(t, a.Tokens)
	}
	captured := wire.bytes()
	require.NotEmpty(t, captured)
	require.Contains(t, string(captured), q, "the capture holds the peer stream (the question crosses it)")

	// The device's passages for the question, as its index returns them.
	ps := devicePassages(t, q, 2)
	require.NotEmpty(t, ps)
	for _, p := range ps {
		for _, chunk := range chunks([]byte(p), 24) {
			assert.False(t, bytes.Contains(captured, chunk), "a piece of a device passage crossed the wire: %q", chunk)
		}
	}
	// The device's cached KV states: no 32-byte run of any of them (with
	// some variety, so not padding) crossed the wire.
	files, err := filepath.Glob(filepath.Join(deviceDir, "*.kv"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "the device cached states")
	checked := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, chunk := range chunks(data[len(data)/2:], 32) {
			if distinct(chunk) < 8 {
				continue
			}
			checked++
			assert.False(t, bytes.Contains(captured, chunk), "KV bytes of %s crossed the wire", f)
		}
	}
	assert.Positive(t, checked)
}

// chunks are up to 16 evenly spaced runs of n bytes of b.
func chunks(b []byte, n int) [][]byte {
	if len(b) < n {
		return nil
	}
	var out [][]byte
	step := max(n, (len(b)-n)/16)
	for off := 0; off+n <= len(b) && len(out) < 16; off += step {
		out = append(out, b[off:off+n])
	}
	return out
}

func distinct(b []byte) int {
	seen := map[byte]bool{}
	for _, x := range b {
		seen[x] = true
	}
	return len(seen)
}

// devicePassages are the texts the device's index returns for q, as the
// device daemon retrieves them (top k, its default ranker).
func devicePassages(t *testing.T, q string, k int) []string {
	t.Helper()
	m, err := llamacpp.Load(testmodel.Path(t), llamacpp.Options{Threads: 1})
	require.NoError(t, err)
	defer m.Close()
	ix, closeIx, err := openIndex(testmodel.IndexDir(t, "device"), m, 1)
	require.NoError(t, err)
	defer closeIx()
	mode, err := retrieval.ParseMode("auto")
	require.NoError(t, err)
	hits, err := ix.Search(context.Background(), q, k, mode)
	require.NoError(t, err)
	var out []string
	for _, h := range hits {
		out = append(out, h.Passage.Text)
	}
	return out
}
