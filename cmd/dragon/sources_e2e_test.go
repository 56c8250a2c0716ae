package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/session"
)

// tap is a TCP proxy between the device and the cloud that keeps every
// byte of its first connection each way (gRPC holds one connection to
// the cloud), so a test can read the peer stream as it crossed.
type tap struct {
	ln                 net.Listener
	upstream           string
	mu                 sync.Mutex
	toCloud, fromCloud bytes.Buffer
}

func newTap(t *testing.T, upstream string) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &tap{ln: ln, upstream: upstream}
	go p.serve()
	t.Cleanup(func() { ln.Close() })
	return p
}

func (p *tap) serve() {
	for first := true; ; first = false {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			c.Close()
			continue
		}
		var toCloud, fromCloud *bytes.Buffer
		if first {
			toCloud, fromCloud = &p.toCloud, &p.fromCloud
		}
		go p.pipe(up, c, toCloud)
		go p.pipe(c, up, fromCloud)
	}
}

// pipe copies src to dst, keeping what it copied in keep (nil: nothing).
func (p *tap) pipe(dst, src net.Conn, keep *bytes.Buffer) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if keep != nil {
				p.mu.Lock()
				keep.Write(buf[:n])
				p.mu.Unlock()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// messages are the PeerMessages one direction of the tapped stream
// carried: HTTP/2 DATA frames, joined per stream, cut into gRPC's
// length-prefixed messages. client is the device's direction (it starts
// with HTTP/2's client preface).
func (p *tap) messages(t *testing.T, client bool) ([]*dragonv1.PeerMessage, []byte) {
	t.Helper()
	p.mu.Lock()
	raw := bytes.Clone(p.toCloud.Bytes())
	if !client {
		raw = bytes.Clone(p.fromCloud.Bytes())
	}
	p.mu.Unlock()
	r := bytes.NewReader(raw)
	if client {
		preface := make([]byte, len(http2.ClientPreface))
		_, err := io.ReadFull(r, preface)
		require.NoError(t, err)
		require.Equal(t, http2.ClientPreface, string(preface))
	}
	fr := http2.NewFramer(io.Discard, r)
	fr.SetMaxReadFrameSize(1 << 24)
	streams := map[uint32]*bytes.Buffer{}
	var order []uint32
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		require.NoError(t, err)
		if d, ok := f.(*http2.DataFrame); ok {
			b := streams[d.StreamID]
			if b == nil {
				b = &bytes.Buffer{}
				streams[d.StreamID] = b
				order = append(order, d.StreamID)
			}
			b.Write(d.Data())
		}
	}
	var out []*dragonv1.PeerMessage
	for _, id := range order {
		b := streams[id].Bytes()
		for len(b) >= 5 {
			require.Zero(t, b[0], "gRPC messages are not compressed")
			n := int(binary.BigEndian.Uint32(b[1:5]))
			require.LessOrEqual(t, 5+n, len(b), "a whole message")
			var m dragonv1.PeerMessage
			require.NoError(t, proto.Unmarshal(b[5:5+n], &m))
			out = append(out, &m)
			b = b[5+n:]
		}
	}
	return out, raw
}

// indexPassage is a line of an index's passages file, as far as the test
// reads it.
type indexPassage struct {
	ID     uint64 `json:"id"`
	Source string `json:"source"`
	Start  int    `json:"start"`
	End    int    `json:"end"`
	Text   string `json:"text"`
}

// tapFound says whether s is in a tapped stream's bytes or in one of its
// messages (encoded again: a string split across HTTP/2 frames is whole
// there).
func tapFound(t *testing.T, raw []byte, msgs []*dragonv1.PeerMessage, s string) bool {
	t.Helper()
	if bytes.Contains(raw, []byte(s)) {
		return true
	}
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}

func readPassages(t *testing.T, dir string) map[uint64]indexPassage {
	t.Helper()
	man, err := retrieval.ReadManifest(dir)
	require.NoError(t, err)
	f, err := os.Open(filepath.Join(dir, man.PassagesFile()))
	require.NoError(t, err)
	defer f.Close()
	out := map[uint64]indexPassage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var p indexPassage
		require.NoError(t, json.Unmarshal(sc.Bytes(), &p))
		out[p.ID] = p
	}
	require.NoError(t, sc.Err())
	return out
}

// TestAnswerSourcesEndToEnd: both daemons as processes, make run's
// question. The answer lists both sides' sources, shares summing to 1;
// the device's entries name real mails of its index; and on the link,
// tapped between the two, nothing of the device's entries crosses (the
// dragon_leak_sources build's device sends them, and the tap must find
// them), while the cloud's entries come back once, after the answer.
func TestAnswerSourcesEndToEnd(t *testing.T) {
	var link *tap
	client, dev, cld := pairWith(t, 0, nil, nil, func(cloudAddr string) string {
		link = newTap(t, cloudAddr)
		return link.ln.Addr().String()
	})
	req := &dragonv1.GenerateRequest{Prompt: promptset.DemoQuestion, Sampling: &dragonv1.SamplingParams{MaxTokens: 24}}
	a, err := ask(t, client, req)
	require.NoError(t, err, "device log:\n%s\ncloud log:\n%s", dev.Logs(), cld.Logs())
	sum := a.Summary
	list := sum.GetSources()
	t.Logf("%q: %d sources", a.Text, len(list))
	assert.False(t, sum.GetSourcesPartial())

	// Both sides', as many as each retrieved, shares summing to 1.
	bySide := map[dragonv1.Side]int{}
	var total float64
	for i, e := range list {
		bySide[e.GetSide()]++
		total += e.GetShare()
		assert.True(t, e.GetHasEvidence(), "entry %d", i)
		assert.NotEmpty(t, e.GetTitle(), "entry %d", i)
		if i > 0 {
			assert.GreaterOrEqual(t, list[i-1].GetShare(), e.GetShare(), "largest share first")
		}
		t.Logf("%d. %v %.3f %s (%s) R=%.2f ll=%.1f", i+1, e.GetSide(), e.GetShare(), e.GetTitle(), e.GetSource(), e.GetScore(), e.GetLogLikelihood())
	}
	assert.Equal(t, int(sum.GetPassagesDevice()), bySide[dragonv1.Side_SIDE_DEVICE])
	assert.Equal(t, int(sum.GetPassagesCloud()), bySide[dragonv1.Side_SIDE_CLOUD])
	assert.InDelta(t, 1, total, 1e-6)

	// The device's entries are mails of its index, where the index says.
	indexed := readPassages(t, testmodel.IndexDir(t, "device"))
	var secret []string
	for _, e := range list {
		if e.GetSide() != dragonv1.Side_SIDE_DEVICE {
			continue
		}
		p, ok := indexed[e.GetPassageId()]
		require.True(t, ok, "passage %d is in the device's index", e.GetPassageId())
		assert.Equal(t, p.Source, e.GetSource())
		assert.Equal(t, uint64(p.Start), e.GetStart())
		assert.Equal(t, uint64(p.End), e.GetEnd())
		assert.True(t, strings.HasSuffix(e.GetSource(), ".eml"), "a mail: %s", e.GetSource())
		_, err := os.Stat(e.GetSource())
		assert.NoError(t, err, "the mail is on the device")
		assert.NotEmpty(t, e.GetMetadata()["from"], "a mail has a sender")
		secret = append(secret, e.GetSource(), e.GetTitle(), e.GetExcerpt(), e.GetDocumentId())
		for _, v := range e.GetMetadata() {
			secret = append(secret, v)
		}
	}
	require.NotEmpty(t, secret)

	// On the link: the device sends its question, and none of its
	// entries' names, titles, metadata or excerpts (the control build
	// sends them, and the tap finds them).
	up, rawUp := link.messages(t, true)
	require.True(t, tapFound(t, rawUp, up, promptset.DemoQuestion), "the tap reads the device's stream")
	var leaked []string
	for _, s := range secret {
		if tapFound(t, rawUp, up, s) {
			leaked = append(leaked, s)
		}
	}
	if session.LeaksSources() {
		assert.NotEmpty(t, leaked, "the control build sends the device's sources: the tap must find them")
	} else {
		assert.Empty(t, leaked, "nothing of the device's sources crosses the link")
	}

	// The cloud's entries cross once, after the answer, and their size is
	// what sources add to an answer.
	down, _ := link.messages(t, false)
	var cloudSources *dragonv1.Sources
	for _, m := range down {
		if s := m.GetSources(); s != nil {
			require.Nil(t, cloudSources, "one Sources message")
			cloudSources = s
		}
	}
	require.NotNil(t, cloudSources, "the cloud sent its sources")
	require.Len(t, cloudSources.GetSources(), bySide[dragonv1.Side_SIDE_CLOUD])
	for _, e := range cloudSources.GetSources() {
		assert.True(t, tapFound(t, nil, down, e.GetSource()))
	}
	var cancel *dragonv1.Cancel
	for _, m := range up {
		if c := m.GetCancel(); c != nil {
			cancel = c
		}
	}
	require.NotNil(t, cancel)
	t.Logf("sources add %d bytes down (the cloud's %d entries) and %d up (the answer's %d tokens in the Cancel) to an answer of %d tokens",
		proto.Size(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Sources{Sources: cloudSources}}), len(cloudSources.GetSources()),
		proto.Size(&dragonv1.Cancel{Answer: cancel.GetAnswer()}), len(cancel.GetAnswer()), len(a.Tokens))

	// Sources change no answer.
	req.OmitSources = true
	b, err := ask(t, client, req)
	require.NoError(t, err)
	assert.Equal(t, a.Tokens, b.Tokens, "the same greedy answer without sources")
	assert.Empty(t, b.Summary.GetSources())
}

// TestAskSharesOf: dragon ask --shares-of decodes a given answer over the
// retrieved passages and prints, after each of its tokens, each passage's
// share of the answer so far, summing to 1.
func TestAskSharesOf(t *testing.T) {
	argv := []string{"ask", "--model", testmodel.Path(t), "--index", testmodel.IndexDir(t, "device"), "--retrieval", "bm25",
		"-k", "2", "--threads", "1", "--question", "What did my mail say about California electricity prices?",
		"--shares-of", "Prices were soaring in California."}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "DRAGON_CHILD_ARGS="+strings.Join(argv, "\n"))
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Greater(t, len(lines), 3, "%s", out)
	assert.True(t, strings.HasPrefix(lines[0], "passage 1: R="), lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "passage 2: R="), lines[1])
	for _, l := range lines[2:] {
		f := strings.Fields(l)
		require.GreaterOrEqual(t, len(f), 3, l)
		var sum float64
		for _, v := range f[len(f)-2:] {
			x, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err, l)
			sum += x
		}
		assert.InDelta(t, 1, sum, 2e-3, l)
	}
	assert.Contains(t, lines[len(lines)-1], `"Prices were soaring in California."`)
}
