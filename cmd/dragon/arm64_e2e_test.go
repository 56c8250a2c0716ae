package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go"
	"github.com/openai/openai-go/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/internal/testmodel"
)

// The arm64 build (make device-arm64) run under qemu-aarch64: the phone's
// binary, exercised on this x86 machine.

// arm64CPU is the core qemu emulates: a Cortex-A76 (phones since 2019, the
// Raspberry Pi 5), ARMv8.2 with the dot-product instructions and without
// SVE or i8mm. qemu's default, "max", has every extension, so a binary
// that used one a phone lacks would pass there and crash on the phone.
const arm64CPU = "cortex-a76"

// arm64Prompt is short (emulation decodes about one token a second) and
// its greedy answer has no near-tie among its first tokens, so the x86 and
// arm64 builds must agree on it although their kernels round differently.
const arm64Prompt = "What is the capital of France?"

// arm64Tokens is how many tokens each build generates for arm64Prompt
// (its answer, "The capital of France is Paris.", ends at the 8th).
const arm64Tokens = 8

// maxArm64Drift bounds how far a logit of the arm64 build may stray from
// the x86 build's on the same step. Rounding alone moved them by up to
// 0.4 here (Q8_0 weights, 30 layers); a wrong kernel moves them by whole
// logits.
const maxArm64Drift = 2.0

// arm64Dragon is qemu-aarch64 and the arm64 binary. `make test` builds
// the binary and names it in $DRAGON_ARM64_BIN, and then a missing one
// fails the test; run otherwise, the test looks for bin/linux-arm64/dragon
// and skips, saying how to build it, when it or qemu is missing.
func arm64Dragon(t *testing.T) (qemu, bin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("the emulated arm64 build takes minutes: not in -short runs")
	}
	bin = os.Getenv("DRAGON_ARM64_BIN")
	required := bin != ""
	if !required {
		bin = filepath.Join(testmodel.Root(), "bin", "linux-arm64", "dragon")
	}
	missing := t.Skipf
	if required {
		missing = t.Fatalf
	}
	if _, err := os.Stat(bin); err != nil {
		missing("no arm64 binary: run `make device-arm64` (%v)", err)
	}
	qemu, err := exec.LookPath("qemu-aarch64")
	if err != nil {
		missing("no qemu-aarch64 to run the arm64 binary: run `make deps` (Debian's qemu-user) (%v)", err)
	}
	return qemu, bin
}

// arm64Command runs the arm64 dragon with args under qemu.
func arm64Command(ctx context.Context, qemu, bin string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, qemu, append([]string{"-cpu", arm64CPU, bin}, args...)...)
}

// parseGenerated reads `dragon generate --json`'s output.
func parseGenerated(t *testing.T, out []byte) []generatedToken {
	t.Helper()
	var toks []generatedToken
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var g generatedToken
		require.NoError(t, json.Unmarshal(sc.Bytes(), &g), "%s", sc.Text())
		toks = append(toks, g)
	}
	require.NoError(t, sc.Err())
	return toks
}

// tokenComparison is two builds' greedy tokens for one prompt, step by
// step.
type tokenComparison struct {
	// First is the first step where the builds chose different tokens, or
	// where one stopped and the other did not; -1 when they agree.
	First int
	// Drift is the largest difference between the builds' logits for the
	// same token over the steps before First: the chosen token's and,
	// where both name the same one, the runner-up's.
	Drift float64
	// Explained says the difference at First is a near-tie that Drift
	// accounts for: the builds swapped the same two tokens, and the
	// margins by which each preferred its own (MarginA + MarginB) add up
	// to no more than two logits drifting by Drift in opposite directions.
	Explained        bool
	MarginA, MarginB float64
}

// compareTokens compares build a's tokens with build b's.
func compareTokens(a, b []generatedToken) tokenComparison {
	c := tokenComparison{First: -1}
	n := min(len(a), len(b))
	for i := range n {
		if a[i].ID != b[i].ID {
			c.First = i
			break
		}
		c.Drift = max(c.Drift, math.Abs(float64(a[i].Logit-b[i].Logit)))
		if a[i].RunnerUp == b[i].RunnerUp {
			c.Drift = max(c.Drift, math.Abs(float64(a[i].RunnerUpLogit-b[i].RunnerUpLogit)))
		}
	}
	if c.First < 0 {
		if len(a) != len(b) {
			c.First = n // one build went on where the other had stopped
		}
		return c
	}
	x, y := a[c.First], b[c.First]
	c.MarginA = float64(x.Logit - x.RunnerUpLogit)
	c.MarginB = float64(y.Logit - y.RunnerUpLogit)
	c.Explained = c.First > 0 && x.RunnerUp == y.ID && y.RunnerUp == x.ID && c.MarginA+c.MarginB <= 2*c.Drift
	return c
}

// describe says where and why the builds differ, for the test's log.
func (c tokenComparison) describe(a, b []generatedToken) string {
	if c.First < 0 {
		return fmt.Sprintf("all %d tokens equal; logits differ by up to %.3f", len(a), c.Drift)
	}
	at := func(toks []generatedToken) string {
		if c.First >= len(toks) {
			return "(stopped)"
		}
		g := toks[c.First]
		return fmt.Sprintf("%d %q (logit %.3f, runner-up %d at %.3f)", g.ID, g.Text, g.Logit, g.RunnerUp, g.RunnerUpLogit)
	}
	s := fmt.Sprintf("first difference at token %d: x86 %s, arm64 %s; the %d tokens before it are equal, their logits differ by up to %.3f",
		c.First, at(a), at(b), c.First, c.Drift)
	if c.Explained {
		s += fmt.Sprintf("; a near-tie the kernels' rounding explains: the x86 (AVX2) and arm64 (NEON dot-product) kernels sum "+
			"in different orders and approximate exp and SiLU differently, and the two tokens' margins (%.3f and %.3f) are "+
			"within twice that drift", c.MarginA, c.MarginB)
	} else {
		s += "; not a near-tie that rounding explains"
	}
	return s
}

func TestCompareTokens(t *testing.T) {
	tok := func(id, ru int32, l, rl float32) generatedToken {
		return generatedToken{ID: id, RunnerUp: ru, Logit: l, RunnerUpLogit: rl}
	}
	x86 := []generatedToken{tok(1, 2, 20, 15), tok(3, 4, 18, 17.9), tok(5, 6, 10, 9)}

	c := compareTokens(x86, []generatedToken{tok(1, 2, 20.25, 15.5), tok(3, 4, 18.1, 18), tok(5, 6, 10, 9)})
	assert.Equal(t, -1, c.First)
	assert.InDelta(t, 0.5, c.Drift, 1e-6)

	// Swapped near-tie at step 1 after a drift of 0.5: explained.
	c = compareTokens(x86, []generatedToken{tok(1, 2, 20.25, 15.5), tok(4, 3, 18.05, 18)})
	assert.Equal(t, 1, c.First)
	assert.True(t, c.Explained)
	assert.Contains(t, c.describe(x86, nil), "first difference at token 1")

	// A margin of 3 logits after a drift of 0.5: not explained.
	c = compareTokens(x86, []generatedToken{tok(1, 2, 20.25, 15.5), tok(4, 3, 21, 18)})
	assert.False(t, c.Explained)

	// A different token at the first step: no drift measured, not explained.
	c = compareTokens(x86, []generatedToken{tok(2, 1, 20, 19.99)})
	assert.Equal(t, 0, c.First)
	assert.False(t, c.Explained)

	// One build stops (end of generation) where the other goes on.
	c = compareTokens(x86, x86[:2])
	assert.Equal(t, 2, c.First)
	assert.False(t, c.Explained)
}

// TestArm64GenerateMatchesX86: `dragon generate` of the arm64 build, run
// under qemu on a Cortex-A76, chooses the same greedy tokens as this x86
// build for the same prompt and model; a difference fails unless it is a
// near-tie within the logits' measured drift, and either way the log shows
// the first differing step.
func TestArm64GenerateMatchesX86(t *testing.T) {
	qemu, bin := arm64Dragon(t)
	args := []string{"generate", "--model", testmodel.Path(t), "--prompt", arm64Prompt,
		"--max-tokens", fmt.Sprint(arm64Tokens), "--threads", "1", "--json"}

	start := time.Now()
	cmd := newGenerateCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(args[1:])
	require.NoError(t, cmd.ExecuteContext(t.Context()))
	x86 := parseGenerated(t, out.Bytes())
	x86Took := time.Since(start)

	start = time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var stderr strings.Builder
	c := arm64Command(ctx, qemu, bin, args...)
	c.Stderr = &stderr
	raw, err := c.Output()
	require.NoError(t, err, "arm64 dragon generate:\n%s", stderr.String())
	arm := parseGenerated(t, raw)
	t.Logf("x86 in %v, arm64 under qemu (%s) in %v: %s", x86Took.Round(time.Millisecond), arm64CPU,
		time.Since(start).Round(time.Millisecond), strings.TrimSpace(stderr.String()))

	require.NotEmpty(t, x86)
	cmp := compareTokens(x86, arm)
	msg := cmp.describe(x86, arm)
	t.Log(msg)
	if cmp.First >= 0 && !cmp.Explained {
		t.Errorf("the arm64 build's tokens differ from the x86 build's: %s", msg)
	}
	assert.Less(t, cmp.Drift, maxArm64Drift, "arm64 logits stray from x86's further than rounding does")
	agreed := x86
	if cmp.First >= 0 {
		agreed = x86[:cmp.First]
	}
	var text strings.Builder
	for _, g := range agreed {
		text.WriteString(g.Text)
	}
	t.Logf("agreed on %q", text.String())
}

// arm64Docs are the private documents of the emulated device's index.
var arm64Docs = map[string]string{
	"shed.txt":    "Note to self: the spare key to the blue garden shed is hidden under the third flowerpot by the back door.",
	"dentist.txt": "Reminder: my dentist appointment with Dr. Okafor moved to Thursday at 4 pm.",
	"bike.txt":    "The bicycle lock combination is written on the back of the red notebook in the kitchen drawer.",
}

// TestArm64DeviceAnswersOverOpenAI: the arm64 device daemon, under qemu
// on a loopback port with a BM25 index built by the x86 build (as a user
// builds it on a computer and copies it to the phone), answers a
// device-only question through its OpenAI chat completions endpoint, then
// stops cleanly on SIGTERM.
func TestArm64DeviceAnswersOverOpenAI(t *testing.T) {
	qemu, bin := arm64Dragon(t)
	model := testmodel.Path(t)
	docs := t.TempDir()
	for name, text := range arm64Docs {
		require.NoError(t, os.WriteFile(filepath.Join(docs, name), []byte(text+"\n"), 0o644))
	}
	index := filepath.Join(t.TempDir(), "index")
	_, err := runIndex(t, "build", "--dir", index, "--model", model, "--dense=false", "-q", docs)
	require.NoError(t, err)

	// One passage and no local speculative decoding: at emulation's
	// second per token, measuring the verifier's costs at start-up (its
	// table) would take minutes, and each passage is a prefill.
	start := time.Now()
	d, err := aggbench.StartDaemon("arm64 device", "", nil, qemu, "-cpu", arm64CPU, bin, "device",
		"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", model, "--threads", "1",
		"--index", index, "--retrieval", "bm25", "--cloud", "", "--profile", "", "--rerank-model", "",
		"--passages", "1", "--max-passages", "1", "--cloud-passages", "0", "--ctx", "256", "--no-spec")
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Stop(time.Minute), "the arm64 device stops cleanly on SIGTERM") })
	require.Eventually(t, func() bool { return d.HTTPAddr() != "" }, 30*time.Second, 50*time.Millisecond, "%s", d.Logs())
	t.Logf("arm64 device serving after %v", time.Since(start).Round(time.Millisecond))

	start = time.Now()
	c := openai.NewClient(option.WithBaseURL("http://"+d.HTTPAddr()+"/v1/"), option.WithAPIKey("none"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:       strings.TrimSuffix(filepath.Base(model), ".gguf"), // the daemon's default model id
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Where is the spare key to the blue garden shed?")},
		MaxTokens:   openai.Int(6),
		Temperature: openai.Float(0),
	}, option.WithRequestTimeout(5*time.Minute))
	require.NoError(t, err, "device log:\n%s", d.Logs())
	require.NotEmpty(t, res.Choices)
	answer := res.Choices[0].Message.Content
	t.Logf("answered in %v: %q", time.Since(start).Round(time.Millisecond), answer)
	assert.NotEmpty(t, strings.TrimSpace(answer))
	assert.Contains(t, []string{"stop", "length"}, res.Choices[0].FinishReason)
	var ext struct {
		Dragon struct {
			Mode           string `json:"mode"`
			PassagesDevice int    `json:"passages_device"`
		} `json:"dragon"`
	}
	require.NoError(t, json.Unmarshal([]byte(res.RawJSON()), &ext))
	assert.Equal(t, "device-only", ext.Dragon.Mode)
	assert.Equal(t, 1, ext.Dragon.PassagesDevice, "the answer read the private passage")
}
