package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/internal/testmodel"
	"github.com/dragon-rag/dragon/netsim"
	"github.com/dragon-rag/dragon/webui"
)

// chromium finds Debian's Chromium (make deps installs it). Without it the
// browser tests skip, except under CI, where a skip would hide them.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("DRAGON_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed (make deps installs Debian's)")
	}
	t.Skip("chromium is not installed (make deps installs Debian's)")
	return ""
}

// browser starts a headless Chromium of its own (a fresh profile, no
// network but loopback's) and returns a tab's context.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]),
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1280, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	return ctx
}

// inBrowser runs browser actions with a deadline.
func inBrowser(t *testing.T, ctx context.Context, timeout time.Duration, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, actions...))
}

// eval evaluates a script in the page (awaiting a promise).
func eval[T any](t *testing.T, ctx context.Context, script string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](script, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "evaluate %.200s", script)
	return v
}

// waitFor polls a script until it is true.
func waitFor(t *testing.T, ctx context.Context, timeout time.Duration, script, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if eval[bool](t, ctx, script) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %s; the page says:\n%s", timeout, what, eval[string](t, ctx, `document.body.innerText`))
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// screenshot saves the page as PNG under $DRAGON_SCREENSHOTS (make
// screenshots: docs/) or build/screenshots, for a person to look at.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("DRAGON_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join("..", "..", "build", "screenshots")
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	t.Logf("screenshot: %s", filepath.Join(dir, name))
}

// axeViolations runs axe-core in the page and returns the serious and
// critical violations, one line each.
func axeViolations(t *testing.T, ctx context.Context, axe string) []string {
	t.Helper()
	type violation struct {
		ID     string `json:"id"`
		Impact string `json:"impact"`
		Help   string `json:"help"`
		Nodes  []struct {
			Target []string `json:"target"`
		} `json:"nodes"`
	}
	res := eval[[]violation](t, ctx, axe+`; axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations)`)
	var out []string
	for _, v := range res {
		if v.Impact == "serious" || v.Impact == "critical" {
			var at []string
			for _, n := range v.Nodes {
				at = append(at, strings.Join(n.Target, " "))
			}
			out = append(out, fmt.Sprintf("%s (%s): %s at %v", v.ID, v.Impact, v.Help, at))
		}
	}
	return out
}

// askInPage types a question, sends it with Enter, and waits for its
// answer to end (n answers so far).
func askInPage(t *testing.T, ctx context.Context, q string, n int) {
	t.Helper()
	inBrowser(t, ctx, 10*time.Second, chromedp.SendKeys(chromedp.CSS("#prompt"), q+"\r"))
	waitFor(t, ctx, 3*time.Minute, fmt.Sprintf(`window.dragonMetrics.answers >= %d || !!document.querySelector(".msg:last-child .error")`, n), "the answer")
	failed := eval[string](t, ctx, `(document.querySelector(".msg:last-child .error") || {}).textContent || ""`)
	require.Empty(t, failed, "the page shows an error")
}

// lastAnswer is the last answer's text and its sources' texts by side.
type pageAnswer struct {
	Text   string   `json:"text"`
	Device []string `json:"device"`
	Cloud  []string `json:"cloud"`
}

func lastAnswer(t *testing.T, ctx context.Context) pageAnswer {
	t.Helper()
	return eval[pageAnswer](t, ctx, `(() => {
		const li = document.querySelector(".msg.assistant:last-child");
		const side = (s) => [...li.querySelectorAll(".sources ." + s + " summary")].map(e => e.textContent);
		return {text: li.querySelector(".text").textContent, device: side("device"), cloud: side("cloud")};
	})()`)
}

// TestPageInBrowser drives the device's page in headless Chromium: the
// token typed once, a question answered as it streams with both sides'
// sources, greedy text equal to dragon ask's, a document uploaded, asked
// about and deleted, the cloud killed mid-answer and the fallback shown,
// a phone's width, and no serious or critical axe-core violation.
// Screenshots go to build/screenshots (make screenshots: docs/).
func TestPageInBrowser(t *testing.T) {
	ctx := browser(t)
	axe, err := os.ReadFile(filepath.Join("..", "..", "build", "axe-core", "axe.min.js"))
	if err != nil && os.Getenv("CI") == "" {
		t.Skip("axe-core is not fetched (make test fetches it: scripts/fetch-axe.sh)")
	}
	require.NoError(t, err)
	pair := testPair(t)
	cld := startDaemon(t, "cloud", "cloud", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", pair.cloudModel, "--threads", "1",
		"--index", pair.cloudIndex, "--profile", "", "--rerank-model", pair.rerank)
	// A link of 20 ms each way: answers last long enough to be cut.
	link := shapedLink(t, cld.Addr, netsim.Shape{Latency: 20 * time.Millisecond})
	dev := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", pair.deviceModel, "--threads", "1",
		"--index", pair.deviceIndex(), "--cloud", link, "--profile", "", "--rerank-model", pair.rerank,
		"--token", "page-token", "--max-tokens", pair.maxTokens)
	page := "http://" + dev.HTTPAddr() + "/"

	// The token, typed once: kept across a reload.
	inBrowser(t, ctx, 30*time.Second, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#token-input")))
	inBrowser(t, ctx, 10*time.Second, chromedp.SendKeys(chromedp.CSS("#token-input"), "page-token\r"))
	waitFor(t, ctx, 30*time.Second, `document.getElementById("status").textContent.includes("cloud connected")`, "the status line")
	inBrowser(t, ctx, 30*time.Second, chromedp.Reload())
	waitFor(t, ctx, 30*time.Second, `document.getElementById("status").textContent.includes("cloud connected") && !document.getElementById("token").open`, "the status line after a reload, with no token asked")

	// A question, streamed, with each side's sources.
	askInPage(t, ctx, promptset.DemoQuestion, 1)
	a := lastAnswer(t, ctx)
	assert.NotEmpty(t, strings.TrimSpace(a.Text))
	assert.NotEmpty(t, a.Device, "the device's sources, marked private")
	assert.NotEmpty(t, a.Cloud, "the cloud's sources, marked public")
	status := eval[string](t, ctx, `document.getElementById("status").textContent`)
	assert.Contains(t, status, "tokens/s")
	assert.Contains(t, status, "decided by")
	paint := eval[[]float64](t, ctx, `window.dragonMetrics.paint`)
	require.NotEmpty(t, paint)
	slices.Sort(paint)
	t.Logf("a streamed chunk reached the screen %.1f ms (median) / %.1f ms (most) after it arrived, over %d chunks", paint[len(paint)/2], paint[len(paint)-1], len(paint))
	weight, err := webui.Weight()
	require.NoError(t, err)
	t.Logf("the page weighs %d bytes (HTML, JS, CSS, icon; uncompressed)", weight)
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(".msg.assistant:last-child details summary")))
	screenshot(t, ctx, "page-desktop.png")
	assert.Empty(t, axeViolations(t, ctx, string(axe)), "the answer's view")

	// Greedy: the page's answer is dragon ask's, token for token.
	out, err := dragonCLI(t, nil, "ask", "--device", dev.Addr, "--device-insecure", "--device-token", "page-token",
		"--temperature", "0", "--max-tokens", pair.maxTokens, "--json", promptset.DemoQuestion)
	require.NoError(t, err, out)
	var cli struct {
		Text string `json:"text"`
	}
	require.NoError(t, json.Unmarshal([]byte(out[strings.LastIndex(out, "\n{")+1:]), &cli), out)
	assert.Equal(t, cli.Text, a.Text, "greedy answers through the page equal dragon ask's")

	// An app and the page at the same moment: the page's question waits
	// in the device's queue, says so, and is answered after the app's.
	appDone := make(chan error, 1)
	appBegan := make(chan struct{})
	go func() { appDone <- streamFromApp(dev.HTTPAddr(), "page-token", appBegan) }()
	select {
	case <-appBegan:
	case err := <-appDone:
		require.NoError(t, err, "the app's answer")
	}
	askInPage(t, ctx, "What did the president propose on energy?", 2)
	require.NoError(t, <-appDone, "the app's answer")
	assert.Equal(t, 1, eval[int](t, ctx, `window.dragonMetrics.queued`), "the page showed its wait")

	// A document, uploaded through the file chooser, then asked about.
	mail := filepath.Join(t.TempDir(), "gate.eml")
	require.NoError(t, os.WriteFile(mail, []byte(gateMail), 0o644))
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#open-docs")), chromedp.WaitVisible(chromedp.CSS("#drop")))
	inBrowser(t, ctx, 10*time.Second, chromedp.SetUploadFiles(chromedp.CSS("#file"), []string{mail}))
	waitFor(t, ctx, 30*time.Second, `document.getElementById("upload-result").textContent.includes("gate.eml: added")`, "the upload's outcome")
	waitFor(t, ctx, 10*time.Second, `document.getElementById("doc-list").textContent.includes("Halvorsen cabin gate code")`, "the document in the list")
	assert.Empty(t, axeViolations(t, ctx, string(axe)), "the documents view")
	screenshot(t, ctx, "page-documents.png")
	inBrowser(t, ctx, 10*time.Second, chromedp.SendKeys(chromedp.CSS("#doc-q"), "Halvorsen gate code\r"))
	waitFor(t, ctx, 10*time.Second, `document.getElementById("doc-hits").textContent.includes("4417")`, "the search's hit")
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#docs [data-close]")))
	// Another subject: a new conversation, whose retrieval the earlier
	// turns do not steer.
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#new-chat")))
	askInPage(t, ctx, "What is the gate code of the Halvorsen cabin?", 3)
	a = lastAnswer(t, ctx)
	assert.True(t, slices.ContainsFunc(a.Device, func(s string) bool { return strings.Contains(s, "Halvorsen cabin gate code") }), "%v", a.Device)

	// Deleted from the list: gone from the device.
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#open-docs")), chromedp.WaitVisible(chromedp.CSS("#doc-list")))
	waitFor(t, ctx, 10*time.Second, `!!document.querySelector('#doc-list button[aria-label="Delete gate.eml"]')`, "the delete button")
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS(`#doc-list button[aria-label="Delete gate.eml"]`)))
	waitFor(t, ctx, 10*time.Second, `!document.getElementById("doc-list").textContent.includes("gate.eml")`, "the document gone from the list")
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#docs [data-close]")))
	found := eval[bool](t, ctx, `fetch("/v1/documents/search?q=Halvorsen+gate+code", {headers: {Authorization: "Bearer page-token"}})
		.then(r => r.json()).then(b => b.hits.some(h => h.source === "gate.eml"))`)
	assert.False(t, found, "a deleted document is not retrieved")

	// Settings: a longer answer; the cloud dies once it has begun.
	inBrowser(t, ctx, 10*time.Second, chromedp.Click(chromedp.CSS("#open-settings")), chromedp.WaitVisible(chromedp.CSS("#settings-form")))
	assert.Empty(t, axeViolations(t, ctx, string(axe)), "the settings")
	inBrowser(t, ctx, 10*time.Second,
		chromedp.SetValue(chromedp.CSS(`#settings-form [name="max_tokens"]`), "64"),
		chromedp.Click(chromedp.CSS("#settings-save")))
	inBrowser(t, ctx, 10*time.Second, chromedp.SendKeys(chromedp.CSS("#prompt"), "Write a long story about a lighthouse keeper and the sea.\r"))
	waitFor(t, ctx, time.Minute, `(document.querySelector(".msg.assistant:last-child .text") || {}).textContent.length > 0`, "the answer's first token")
	require.NoError(t, cld.Kill())
	waitFor(t, ctx, time.Minute, `window.dragonMetrics.answers >= 4`, "the answer, finished alone")
	notice := eval[string](t, ctx, `document.querySelector(".msg.assistant:last-child .fallback").textContent`)
	assert.Contains(t, notice, "finishes the answer alone")
	waitFor(t, ctx, 15*time.Second, `!document.getElementById("status").textContent.includes("cloud connected")`, "the status line saying the cloud is gone")
	inBrowser(t, ctx, 10*time.Second, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, document.body.scrollHeight)`))
	screenshot(t, ctx, "page-fallback.png")

	// A phone's screen: nothing wider than it, and still accessible.
	inBrowser(t, ctx, 10*time.Second, chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(3), chromedp.EmulateMobile), chromedp.Reload())
	waitFor(t, ctx, 30*time.Second, `document.querySelectorAll(".msg").length == 4`, "the conversation, kept in the browser")
	overflow := eval[float64](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`)
	assert.LessOrEqual(t, overflow, 0.0, "no sideways scrolling on a phone")
	assert.Empty(t, axeViolations(t, ctx, string(axe)), "the phone's view")
	screenshot(t, ctx, "page-phone.png")

	// A device with no cloud at all: shown as device-only, answering alone
	// with no notice of a failure.
	solo := startDaemon(t, "device", "device", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--model", pair.deviceModel, "--threads", "1",
		"--index", pair.deviceIndex(), "--cloud", "", "--profile", "", "--rerank-model", pair.rerank, "--max-tokens", pair.maxTokens)
	tab, closeTab := chromedp.NewContext(ctx)
	defer closeTab()
	require.NoError(t, chromedp.Do(tab), "a new tab (its first run sets no deadline: one would close it)")
	inBrowser(t, tab, 30*time.Second, chromedp.Navigate("http://"+solo.HTTPAddr()+"/"))
	waitFor(t, tab, 30*time.Second, `document.getElementById("status").textContent.includes("device only")`, "the status line of a device without a cloud")
	askInPage(t, tab, "What did my mail say about California electricity prices?", 1)
	a = lastAnswer(t, tab)
	assert.NotEmpty(t, a.Device)
	assert.Empty(t, a.Cloud)
	assert.False(t, eval[bool](t, tab, `!!document.querySelector(".fallback")`), "no failure to report")
}

// pagePair is what the browser test runs: the tests' SmolLM2 with short
// answers, or, with DRAGON_PAGE_PAIR=default (make screenshots), what
// make run does (the Qwen pair, its indexes, the re-ranker), so that the
// README's pictures show real answers.
type pagePair struct {
	deviceModel, cloudModel, cloudIndex, rerank, maxTokens string
	// deviceIndex is the device's index, copied for each device daemon
	// (its writer).
	deviceIndex func() string
}

func testPair(t *testing.T) pagePair {
	t.Helper()
	if os.Getenv("DRAGON_PAGE_PAIR") != "default" {
		return pagePair{deviceModel: testmodel.Path(t), cloudModel: testmodel.Path(t), cloudIndex: testmodel.IndexDir(t, "cloud"), maxTokens: "8",
			deviceIndex: func() string { return testmodel.IndexCopy(t, "device") }}
	}
	qwen := filepath.Join(testmodel.Root(), "data", "index-qwen")
	return pagePair{deviceModel: testmodel.QwenDevicePath(t), cloudModel: testmodel.QwenCloudPath(t),
		cloudIndex: filepath.Join(qwen, "cloud"), rerank: testmodel.RerankPath(t), maxTokens: "40",
		deviceIndex: func() string {
			device := filepath.Join(t.TempDir(), "device")
			require.NoError(t, os.CopyFS(device, os.DirFS(filepath.Join(qwen, "device"))), "make index-qwen builds the indexes")
			return device
		}}
}

// streamFromApp asks the device's OpenAI API for a long streamed answer,
// as an app would, closing began once its first event is in, and reads it
// to its end.
func streamFromApp(httpAddr, token string, began chan<- struct{}) error {
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	req, err := http.NewRequest("GET", "http://"+httpAddr+"/v1/models", nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	err = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if err != nil || len(models.Data) == 0 {
		return fmt.Errorf("models: %v", err)
	}
	body := `{"model":"` + models.Data[0].ID + `","stream":true,"max_tokens":96,"temperature":0,` +
		`"messages":[{"role":"user","content":"Tell me a long story about the sea."}]}`
	req, err = http.NewRequest("POST", "http://"+httpAddr+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, b)
	}
	sc := bufio.NewScanner(resp.Body)
	first := true
	for sc.Scan() {
		if first && strings.HasPrefix(sc.Text(), "data: ") {
			close(began)
			first = false
		}
		if sc.Text() == "data: [DONE]" {
			return nil
		}
	}
	return fmt.Errorf("the stream ended without [DONE]: %v", sc.Err())
}
