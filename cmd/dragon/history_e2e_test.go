package main

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// TestHistoryNeverCrossesTheLink: the device's store of earlier answers
// (--history-tokens, kept across a restart in --history-file) is private.
// An answer given on the device alone goes into the store; after a
// restart, a question asked with the cloud drafts from that store, and
// nothing of the stored answer is on the tapped link. The control sends
// the same answer as the conversation's history, which the app chose to
// share: the tap must then find it.
func TestHistoryNeverCrossesTheLink(t *testing.T) {
	model := testmodel.Path(t)
	histFile := t.TempDir() + "/history"
	index := testmodel.IndexCopy(t, "device")
	devArgs := func(cloud string) []string {
		return []string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
			"--index", index, "--cloud", cloud, "--profile", "", "--rerank-model", "",
			"--history-tokens", "4096", "--history-file", histFile}
	}

	// Alone: the answer never met the cloud, and joins the store.
	dev := startDaemon(t, "device", devArgs("")...)
	private, err := ask(t, dialDevice(t, dev), &dragonv1.GenerateRequest{Prompt: "What did Ann write about the cabin gate?",
		Mode: dragonv1.Mode_MODE_DEVICE_ONLY, Sampling: &dragonv1.SamplingParams{MaxTokens: 16}})
	require.NoError(t, err, "%s", dev.Logs())
	require.NoError(t, dev.Stop(30*time.Second), "a stop saves the store")
	st, err := os.Stat(histFile)
	require.NoError(t, err, "the store is saved: %s", dev.Logs())
	require.Positive(t, st.Size())
	// The answer's longest run of words, as text: what a leak would carry.
	secret := longestWords(private.Text)
	require.GreaterOrEqual(t, len(secret), 12, "a distinctive piece of the private answer: %q", private.Text)

	cld := startDaemon(t, "cloud", "cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", testmodel.IndexDir(t, "cloud"), "--profile", "", "--rerank-model", "")
	link := newTap(t, cld.Addr)
	dev = startDaemon(t, "device", devArgs(link.ln.Addr().String())...)
	require.Eventually(t, func() bool { return strings.Contains(dev.Logs(), "drafting from earlier answers") }, 10*time.Second, 20*time.Millisecond)
	assert.Regexp(t, `drafting from earlier answers.* held=[1-9]`, dev.Logs(), "the restarted device loaded its store")
	client := dialDevice(t, dev)
	// The same question, with the cloud: the device drafts its part from
	// the stored answer.
	a, err := ask(t, client, &dragonv1.GenerateRequest{Prompt: "What did Ann write about the cabin gate?", Sampling: &dragonv1.SamplingParams{MaxTokens: 8}})
	require.NoError(t, err, "%s", dev.Logs())
	require.False(t, a.Summary.GetFallback(), "answered with the cloud: %s", a.Summary.GetFallbackReason())
	up, rawUp := link.messages(t, true)
	assert.False(t, tapFound(t, rawUp, up, secret), "the stored answer %q crossed the link", secret)

	// The control: shared as the conversation's history, it crosses.
	_, err = ask(t, client, &dragonv1.GenerateRequest{Prompt: "And the key?", Sampling: &dragonv1.SamplingParams{MaxTokens: 4},
		History: []*dragonv1.ChatTurn{{Role: dragonv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: private.Text}}})
	require.NoError(t, err)
	up, rawUp = link.messages(t, true)
	assert.True(t, tapFound(t, rawUp, up, secret), "the tap finds %q once the app sends it", secret)
}

// longestWords is the longest run of text between the answer's line
// breaks, trimmed.
func longestWords(text string) string {
	best := ""
	for line := range strings.Lines(text) {
		if line = strings.TrimSpace(line); len(line) > len(best) {
			best = line
		}
	}
	return best
}
