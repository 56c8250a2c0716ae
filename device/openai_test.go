package device

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
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

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine/fake"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

const testModel = "smollm2-test"

// apiServer is the OpenAI front end of a device-only device on a fake
// model, with an API key.
func apiServer(t *testing.T) (*httptest.Server, *Server) {
	return apiServerWith(t, fake.Config{Seed: 3, Vocab: 300})
}

func apiServerWith(t *testing.T, model fake.Config) (*httptest.Server, *Server) {
	srv, err := New(Config{SideConfig: session.SideConfig{
		Model: fake.New(model), Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 512},
		Limits:   session.Limits{MaxTokens: 64, MaxPassages: 2, MaxPrompt: 1000},
		Defaults: session.Defaults{MaxTokens: 16, Mode: dragonv1.Mode_MODE_DEVICE_ONLY},
	}})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	mux := http.NewServeMux()
	NewOpenAI(srv, testModel, "sk-test").Register(mux)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs, srv
}

func client(hs *httptest.Server, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(hs.URL+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// TestOpenAIGoClient drives the API with the official Go client: chat and
// completions, streaming and not, the model list, and DRAGON's options as
// extra fields.
func TestOpenAIGoClient(t *testing.T) {
	hs, _ := apiServer(t)
	c := client(hs, "sk-test")
	ctx := context.Background()

	models, err := c.Models.List(ctx)
	require.NoError(t, err)
	require.Len(t, models.Data, 1)
	assert.Equal(t, testModel, models.Data[0].ID)

	params := openai.ChatCompletionNewParams{
		Model:       testModel,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Be brief."), openai.UserMessage("Who lit the lamp?")},
		Seed:        openai.Int(7),
		Temperature: openai.Float(0),
		MaxTokens:   openai.Int(12),
	}
	full, err := c.Chat.Completions.New(ctx, params, option.WithJSONSet("mode", "device-only"), option.WithJSONSet("passages_device", 0))
	require.NoError(t, err)
	require.Len(t, full.Choices, 1)
	text := full.Choices[0].Message.Content
	assert.NotEmpty(t, text)
	assert.Equal(t, "assistant", string(full.Choices[0].Message.Role))
	assert.Contains(t, []string{"stop", "length"}, full.Choices[0].FinishReason)
	assert.Positive(t, full.Usage.PromptTokens)
	assert.Positive(t, full.Usage.CompletionTokens)
	assert.Equal(t, full.Usage.PromptTokens+full.Usage.CompletionTokens, full.Usage.TotalTokens)

	// Streaming the same greedy request gives the same text.
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}
	chunks := 0
	for stream.Next() {
		acc.AddChunk(stream.Current())
		chunks++
	}
	require.NoError(t, stream.Err())
	assert.Greater(t, chunks, 2)
	assert.Equal(t, text, acc.Choices[0].Message.Content)
	assert.Equal(t, full.Usage.CompletionTokens, acc.Usage.CompletionTokens)

	comp, err := c.Completions.New(ctx, openai.CompletionNewParams{
		Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Who lit the lamp?")},
		Temperature: openai.Float(0), MaxTokens: openai.Int(12), Seed: openai.Int(7),
	})
	require.NoError(t, err)
	assert.Equal(t, text, comp.Choices[0].Text, "the same question, the same answer")
	cs := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model: testModel, Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Who lit the lamp?")},
		Temperature: openai.Float(0), MaxTokens: openai.Int(12),
	})
	var streamed strings.Builder
	for cs.Next() {
		if ch := cs.Current(); len(ch.Choices) > 0 {
			streamed.WriteString(ch.Choices[0].Text)
		}
	}
	require.NoError(t, cs.Err())
	assert.Equal(t, text, streamed.String())
}

// TestOpenAIErrors: every bad request gets the right status and an OpenAI
// error body, and the server keeps serving.
func TestOpenAIErrors(t *testing.T) {
	hs, srv := apiServer(t)
	ctx := context.Background()
	status := func(err error) int {
		var apiErr *openai.Error
		require.True(t, errors.As(err, &apiErr), "%v", err)
		return apiErr.StatusCode
	}
	ok := openai.ChatCompletionNewParams{Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(4)}

	wrong, none := client(hs, "sk-wrong"), client(hs, "")
	_, err := wrong.Chat.Completions.New(ctx, ok)
	assert.Equal(t, http.StatusUnauthorized, status(err), "wrong key")
	_, err = none.Chat.Completions.New(ctx, ok)
	assert.Equal(t, http.StatusUnauthorized, status(err), "missing key")

	c := client(hs, "sk-test")
	unknown := ok
	unknown.Model = "gpt-4o"
	_, err = c.Chat.Completions.New(ctx, unknown)
	assert.Equal(t, http.StatusNotFound, status(err), "unknown model")
	for name, p := range map[string]openai.ChatCompletionNewParams{
		"temperature":     {Model: testModel, Messages: ok.Messages, Temperature: openai.Float(3)},
		"top_p":           {Model: testModel, Messages: ok.Messages, TopP: openai.Float(0)},
		"n":               {Model: testModel, Messages: ok.Messages, N: openai.Int(2)},
		"max_tokens":      {Model: testModel, Messages: ok.Messages, MaxTokens: openai.Int(100000)},
		"no user message": {Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("sys")}},
		"empty prompt":    {Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("")}},
	} {
		_, err := c.Chat.Completions.New(ctx, p)
		assert.Equal(t, http.StatusBadRequest, status(err), name)
	}
	_, err = c.Chat.Completions.New(ctx, ok, option.WithJSONSet("mode", "telepathy"))
	assert.Equal(t, http.StatusBadRequest, status(err), "unknown mode")
	_, err = c.Chat.Completions.New(ctx, ok, option.WithJSONSet("mode", "dragon"))
	assert.Equal(t, http.StatusBadRequest, status(err), "no cloud configured")
	for name, f := range map[string]map[string]any{
		"filter date":         {"filter": map[string]any{"after": "last tuesday"}},
		"cloud filter date":   {"cloud_filter": map[string]any{"before": "2002-13-45"}},
		"before not after":    {"filter": map[string]any{"after": "2002-06-01", "before": "2002-01-01"}},
		"filter not a object": {"filter": "from:ann"},
	} {
		var opts []option.RequestOption
		for k, v := range f {
			opts = append(opts, option.WithJSONSet(k, v))
		}
		_, err = c.Chat.Completions.New(ctx, ok, opts...)
		assert.Equal(t, http.StatusBadRequest, status(err), name)
	}
	_, err = c.Chat.Completions.New(ctx, ok, option.WithJSONSet("filter", map[string]any{"from": "ann", "after": "2002-01-01", "before": "2002-06-01T00:00:00Z"}))
	require.NoError(t, err, "a filter the device-only daemon applies")

	for name, body := range map[string]string{
		"invalid JSON":  `{"model":`,
		"invalid UTF-8": "{\"model\":\"" + testModel + "\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
		"unknown role":  `{"model":"` + testModel + `","messages":[{"role":"wizard","content":"hi"}]}`,
		"image part":    `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		"oversized":     `{"model":"` + testModel + `","messages":[{"role":"user","content":"` + strings.Repeat("a", 2000) + `"}]}`,
	} {
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk-test")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, name)
	}

	// No queue: the second generation is refused at once, with the time to
	// retry after in seconds.
	srv.busy <- struct{}{}
	srv.cfg.MaxQueue = -1
	_, err = c.Chat.Completions.New(ctx, ok)
	assert.Equal(t, http.StatusTooManyRequests, status(err), "one generation at a time")
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	assert.Regexp(t, `^[1-9][0-9]*$`, apiErr.Response.Header.Get("Retry-After"))
	<-srv.busy

	res, err := c.Chat.Completions.New(ctx, ok)
	require.NoError(t, err, "still serving")
	assert.NotEmpty(t, res.Choices)
}

// TestOpenAIClientGoesAway: a client that disconnects mid-stream stops its
// generation, and the next request is served.
func TestOpenAIClientGoesAway(t *testing.T) {
	hs, _ := apiServerWith(t, fake.Config{Seed: 3, Vocab: 300, CallLatency: 20 * time.Millisecond})
	c := client(hs, "sk-test")
	ctx, cancel := context.WithCancel(context.Background())
	stream := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell a long story")}, MaxTokens: openai.Int(64),
	})
	require.True(t, stream.Next())
	cancel()
	for stream.Next() {
	}
	assert.Error(t, stream.Err())
	require.Eventually(t, func() bool {
		_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
			Model: testModel, Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}, MaxTokens: openai.Int(2),
		})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// TestOpenAIPythonClient drives the API with the official Python openai
// package (`make test` installs the pinned version into build/pyopenai).
func TestOpenAIPythonClient(t *testing.T) {
	lib, err := filepath.Abs("../build/pyopenai")
	require.NoError(t, err)
	if _, err := os.Stat(filepath.Join(lib, "openai")); err != nil {
		t.Fatalf("the openai package is not installed in %s: run `make pyopenai` (%v)", lib, err)
	}
	hs, _ := apiServer(t)
	cmd := exec.Command("python3", "testdata/openai_client.py")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+lib, "DRAGON_BASE_URL="+hs.URL+"/v1", "DRAGON_API_KEY=sk-test", "DRAGON_MODEL_ID="+testModel)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "python: %s", stderr.String())
	var got struct {
		Version        string
		Chat           string
		ChatFinish     string `json:"chat_finish"`
		Usage          []int
		Models         []string
		UnknownModel   any `json:"unknown_model"`
		BadTemperature any `json:"bad_temperature"`
	}
	require.NoError(t, json.Unmarshal(out, &got), "%s", out)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(out, &raw))
	t.Logf("openai %s: %q", got.Version, got.Chat)
	assert.NotEmpty(t, got.Chat)
	assert.Equal(t, got.Chat, raw["chat_stream"])
	assert.Equal(t, got.Chat, raw["completion"])
	assert.Equal(t, got.Chat, raw["completion_stream"])
	assert.Contains(t, []string{"stop", "length"}, got.ChatFinish)
	require.Len(t, got.Usage, 3)
	assert.Equal(t, got.Usage[0]+got.Usage[1], got.Usage[2])
	assert.Equal(t, []string{testModel}, got.Models)
	assert.EqualValues(t, 404, got.UnknownModel)
	assert.EqualValues(t, 400, got.BadTemperature)
}

// TestOpenAIChatConversation: the last user message is the prompt, the
// user and assistant messages before it the history in order, system and
// developer messages the system prompt; tool messages and what follows
// the last user message are dropped.
func TestOpenAIChatConversation(t *testing.T) {
	user, assistant := dragonv1.ChatRole_CHAT_ROLE_USER, dragonv1.ChatRole_CHAT_ROLE_ASSISTANT
	cases := []struct {
		name     string
		msgs     []chatMessage
		prompt   string
		system   string
		history  []*dragonv1.ChatTurn
		errorHas string
	}{
		{name: "one question", msgs: []chatMessage{{"user", "Who?"}}, prompt: "Who?"},
		{
			name:    "second turn",
			msgs:    []chatMessage{{"system", "Be brief."}, {"user", "Who lit the lamp?"}, {"assistant", "The keeper."}, {"user", "When?"}},
			prompt:  "When?",
			system:  "Be brief.",
			history: []*dragonv1.ChatTurn{{Role: user, Content: "Who lit the lamp?"}, {Role: assistant, Content: "The keeper."}},
		},
		{
			name: "tools, late system, trailing assistant",
			msgs: []chatMessage{{"developer", "Be brief."}, {"user", "a"}, {"assistant", ""}, {"tool", "42"}, {"assistant", "b"},
				{"system", "Cite."}, {"user", "c"}, {"assistant", "prefill"}},
			prompt: "c",
			system: "Be brief.\nCite.",
			history: []*dragonv1.ChatTurn{{Role: user, Content: "a"}, {Role: assistant, Content: ""},
				{Role: assistant, Content: "b"}},
		},
		{name: "unknown role", msgs: []chatMessage{{"wizard", "hi"}, {"user", "a"}}, errorHas: "messages[0]: unknown role"},
		{name: "no user", msgs: []chatMessage{{"system", "s"}}, errorHas: "no user message"},
		{name: "last user empty", msgs: []chatMessage{{"user", "a"}, {"assistant", "b"}, {"user", ""}}, errorHas: "no user message"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prompt, system, history, err := conversation(tc.msgs)
			if tc.errorHas != "" {
				var br badRequest
				require.ErrorAs(t, err, &br)
				assert.Contains(t, br.msg, tc.errorHas)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.prompt, prompt)
			assert.Equal(t, tc.system, system)
			require.Len(t, history, len(tc.history))
			for i, h := range tc.history {
				assert.Equal(t, h.GetRole(), history[i].GetRole(), "turn %d", i)
				assert.Equal(t, h.GetContent(), history[i].GetContent(), "turn %d", i)
			}
		})
	}
}

// TestOpenAIChatHistoryReachesPrompt: a second turn sent through the API
// is laid out as a conversation in the decoder's prompt, the earlier
// question and answer before the new question.
func TestOpenAIChatHistoryReachesPrompt(t *testing.T) {
	hs, srv := apiServer(t)
	c := client(hs, "sk-test")
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: testModel, MaxTokens: openai.Int(2),
		Messages: []openai.ChatCompletionMessageParamUnion{
			openai.SystemMessage("Be brief."), openai.UserMessage("Who lit the lamp?"),
			openai.AssistantMessage("The keeper."), openai.UserMessage("When?"),
		},
	})
	require.NoError(t, err)
	var prompt strings.Builder
	for _, tok := range srv.dec.Prompt(0) {
		prompt.Write(srv.cfg.Model.Piece(tok))
	}
	assert.Contains(t, prompt.String(), "<|im_start|>system\nBe brief.<|im_end|>\n"+
		"<|im_start|>user\nQuestion: Who lit the lamp?<|im_end|>\n<|im_start|>assistant\nThe keeper.<|im_end|>\n"+
		"<|im_start|>user\nQuestion: When?<|im_end|>\n<|im_start|>assistant\n")
}

// A browser request from another site's page is refused, whatever it
// carries; the device's own page, and clients that are not browsers, are
// served.
func TestCrossOriginRefused(t *testing.T) {
	hs, _ := apiServer(t)
	host := strings.TrimPrefix(hs.URL, "http://")
	body := `{"model":"` + testModel + `","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	for name, c := range map[string]struct {
		header map[string]string
		want   int
	}{
		"no origin (an app)":         {nil, http.StatusOK},
		"the device's own page":      {map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin"}, http.StatusOK},
		"another site's page":        {map[string]string{"Origin": "http://evil.example"}, http.StatusForbidden},
		"another port of this host":  {map[string]string{"Origin": "http://127.0.0.1:1"}, http.StatusForbidden},
		"a form from another site":   {map[string]string{"Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"a sandboxed page":           {map[string]string{"Origin": "null"}, http.StatusForbidden},
		"another site, right token":  {map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		"the same site, another app": {map[string]string{"Sec-Fetch-Site": "same-site"}, http.StatusForbidden},
	} {
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk-test")
		req.Header.Set("Content-Type", "application/json")
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var out map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		assert.Equal(t, c.want, resp.StatusCode, "%s: %v", name, out)
		if c.want == http.StatusForbidden {
			assert.Contains(t, fmt.Sprint(out["error"]), "refused", name)
		}
	}
}
