package main

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/internal/testmodel"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// TestDraftModelRefused: a --draft-model that cannot draft stops the device
// daemon at start-up, saying why.
func TestDraftModelRefused(t *testing.T) {
	model := testmodel.Path(t)
	for name, c := range map[string]struct {
		args []string
		want string
	}{
		"speculation off":     {[]string{"--no-spec"}, "--no-spec turns off"},
		"idle unload":         {[]string{"--idle-unload", "1m"}, "--idle-unload 1m0s with --draft-model"},
		"no such file":        {[]string{"--draft-model", "/nonexistent/draft.gguf"}, "--draft-model"},
		"another tokenizer":   {[]string{"--draft-model", testmodel.QwenDevicePath(t)}, "tokenizer"},
		"a budget too small":  {[]string{"--memory-mb", "150"}, "the draft model kept whole"},
		"the least it names":  {[]string{"--memory-mb", "150"}, "give at least --memory-mb 218,"},
		"a budget for no seq": {[]string{"--memory-mb", "150"}, "--memory-mb 150 cannot hold one passage sequence"},
	} {
		t.Run(name, func(t *testing.T) {
			cmd := newDeviceCmd()
			cmd.SetArgs(append([]string{"--model", model, "--draft-model", model, "--index", "", "--cloud", "", "--profile", "",
				"--kv-cache-mb", "0", "--listen", "127.0.0.1:0", "--http", ""}, c.args...))
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// TestDraftModelAnswersAlike: a device drafting also from a draft model
// (SmolLM2 as its own: its greedy drafts are mostly right) answers with
// the tokens of the same device without one, unbudgeted and with the
// model streamed under --memory-mb beside the draft model kept whole.
func TestDraftModelAnswersAlike(t *testing.T) {
	// A copy of its own for the budgeted runs: its page cache is not
	// shared with other tests' daemons.
	model := t.TempDir() + "/model.gguf"
	src, err := os.ReadFile(testmodel.Path(t))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(model, src, 0o644))
	args := func(extra ...string) []string {
		return append([]string{"device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
			"--index", "", "--cloud", "", "--profile", "", "--kv-cache-mb", "0", "--ctx", "256", "--max-passages", "1", "--passages", "1", "--cloud-passages", "1"}, extra...)
	}
	req := &dragonv1.GenerateRequest{Prompt: "Write three sentences about the sea.", Sampling: &dragonv1.SamplingParams{MaxTokens: 24}}
	var want []int32
	for _, c := range []struct {
		name string
		args []string
		logs []string
	}{
		{"without", args(), nil},
		{"with a draft model", args("--draft-model", model), []string{"drafting also from a draft model"}},
		// The weights are 93 MiB; beside the draft kept whole, --ctx 256
		// and 240 MiB leave some of them to stream.
		{"streamed beside it", args("--draft-model", model, "--memory-mb", strconv.Itoa(240)),
			[]string{"streamed=true", "the draft model is locked in memory", "draft_model_mb="}},
	} {
		dev := startDaemon(t, "device", c.args...)
		a, err := ask(t, dialDevice(t, dev), req)
		require.NoError(t, err, "%s: %s", c.name, dev.Logs())
		require.NotEmpty(t, a.Tokens)
		if want == nil {
			want = a.Tokens
		} else {
			assert.Equal(t, want, a.Tokens, "%s: greedy with a draft model is greedy without", c.name)
		}
		for _, l := range c.logs {
			assert.Contains(t, dev.Logs(), l, c.name)
		}
		t.Logf("%s: %d tokens in %d passes, %d local draft tokens accepted", c.name, len(a.Tokens),
			a.Summary.GetForwardPassesDevice(), a.Summary.GetLocalDraftTokensAcceptedDevice())
		require.NoError(t, dev.Stop(30*time.Second))
	}
}
