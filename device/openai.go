package device

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// OpenAI is an OpenAI-compatible HTTP front end of the device
// (/v1/chat/completions, /v1/completions, /v1/models), so that apps written
// for that API use the device unchanged. DRAGON's own options (mode,
// passages per side, codec top-p, strategy) are extra request fields stock
// clients may omit; the last user message is the query both sides retrieve
// for, system messages the system prompt.
type OpenAI struct {
	srv   *Server
	model string
	token string
	clock func() time.Time
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// NewOpenAI serves srv under the model id model; token, when set, is the
// API key requests must carry ("Authorization: Bearer <token>").
func NewOpenAI(srv *Server, model, token string) *OpenAI {
	return &OpenAI{srv: srv, model: model, token: token, clock: time.Now}
}

// Register adds the API's routes to mux.
func (o *OpenAI) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/models", o.auth(o.models))
	mux.HandleFunc("GET /v1/models/{id}", o.auth(o.modelByID))
	mux.HandleFunc("POST /v1/chat/completions", o.auth(o.chat))
	mux.HandleFunc("POST /v1/completions", o.auth(o.completions))
}

// apiError is an OpenAI error body.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func writeError(w http.ResponseWriter, httpStatus int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(httpStatus)
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	_ = json.NewEncoder(w).Encode(map[string]apiError{"error": e})
}

// writeStatus maps a gRPC status to the API's error.
func writeStatus(w http.ResponseWriter, err error) {
	st := status.Convert(err)
	code, typ := http.StatusInternalServerError, "server_error"
	switch st.Code() {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		code, typ = http.StatusBadRequest, "invalid_request_error"
	case codes.ResourceExhausted:
		code, typ = http.StatusTooManyRequests, "rate_limit_error"
		if d, ok := wire.RetryAfter(err); ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
		}
	case codes.Unavailable:
		code = http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		code = http.StatusGatewayTimeout
	case codes.Canceled:
		code, typ = 499, "invalid_request_error" // the client went away
	case codes.Unimplemented:
		code, typ = http.StatusNotImplemented, "invalid_request_error"
	}
	writeError(w, code, typ, "", st.Message())
}

func (o *OpenAI) auth(h http.HandlerFunc) http.HandlerFunc { return bearer(o.token, h) }

// crossOrigin says why a request comes from another origin's page, or ""
// when it does not: browsers name the page's origin (Origin) on every
// cross-origin request and on same-origin POSTs, and mark what another
// site started (Sec-Fetch-Site); clients that are not browsers send
// neither.
func crossOrigin(r *http.Request) string {
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return "a request from another site's page is refused (Sec-Fetch-Site: " + site + ")"
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return ""
	}
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Sprintf("a request from another origin's page (%.100q) is refused", origin)
	}
	return ""
}

// Guard is bearer's check for handlers outside this package (the page's
// status endpoint).
func Guard(token string, h http.HandlerFunc) http.HandlerFunc { return bearer(token, h) }

// bearer guards h with an API key, when token is set: requests must carry
// "Authorization: Bearer <token>". A request a browser sends from another
// site's page is refused, token or not: the device's page calls from its
// own origin, and no other page may use a browser to reach the device.
func bearer(token string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if why := crossOrigin(r); why != "" {
			writeError(w, http.StatusForbidden, "invalid_request_error", "cross_origin", why)
			return
		}
		if token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(got), []byte(token)) != 1 {
				writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "missing or wrong API key (Authorization: Bearer <key>)")
				return
			}
		}
		h(w, r)
	}
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

func (o *OpenAI) modelObject() modelObject {
	return modelObject{ID: o.model, Object: "model", Created: 0, OwnedBy: "dragon"}
}

func (o *OpenAI) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, map[string]any{"object": "list", "data": []modelObject{o.modelObject()}})
}

func (o *OpenAI) modelByID(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") != o.model {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", fmt.Sprintf("the model %q does not exist; this device serves %q", r.PathValue("id"), o.model))
		return
	}
	writeJSON(w, o.modelObject())
}

func writeJSON(w http.ResponseWriter, v any) { writeJSONStatus(w, http.StatusOK, v) }

// stopField is OpenAI's stop: a string or a list of strings.
type stopField []string

func (s *stopField) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = stopField{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("stop must be a string or a list of strings")
	}
	*s = many
	return nil
}

// content is a message's content: a string or a list of text parts.
type content string

func (c *content) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = content(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return errors.New("message content must be a string or a list of parts")
	}
	var out strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return fmt.Errorf("content parts of type %q are not supported (text only)", p.Type)
		}
		out.WriteString(p.Text)
	}
	*c = content(out.String())
	return nil
}

// options are the fields shared by both endpoints, OpenAI's and DRAGON's.
type options struct {
	Model               string    `json:"model"`
	Stream              bool      `json:"stream"`
	MaxTokens           *int      `json:"max_tokens"`
	MaxCompletionTokens *int      `json:"max_completion_tokens"`
	Temperature         *float64  `json:"temperature"`
	TopP                *float64  `json:"top_p"`
	Seed                *int64    `json:"seed"`
	Stop                stopField `json:"stop"`
	N                   *int      `json:"n"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// DRAGON's options.
	Mode           string   `json:"mode"`
	PassagesDevice *int     `json:"passages_device"`
	PassagesCloud  *int     `json:"passages_cloud"`
	CodecTopP      *float64 `json:"codec_top_p"`
	Strategy       string   `json:"strategy"`
	// ConfidenceTemperature: GenerateRequest's confidence_temperature.
	ConfidenceTemperature *float64 `json:"confidence_temperature"`
	// IncludeSources false leaves the answer's sources out (PrivateGPT's
	// name for the switch; they are on by default).
	IncludeSources *bool `json:"include_sources"`
	// PosteriorEvery: GenerateRequest's posterior_every.
	PosteriorEvery *int `json:"posterior_every"`
	// Filter narrows the device's retrieval (it stays on the device),
	// CloudFilter the cloud's.
	Filter      *filterJSON `json:"filter"`
	CloudFilter *filterJSON `json:"cloud_filter"`
	// Progress, with stream, sends what the generation does before its
	// first token as events of no choices and a dragon_progress object.
	Progress bool `json:"progress"`
}

// filterJSON is a RetrievalFilter in the API: dates as RFC 3339 times or
// days ("2002-09-01").
type filterJSON struct {
	SourcePrefix string `json:"source_prefix"`
	From         string `json:"from"`
	After        string `json:"after"`
	Before       string `json:"before"`
}

func (f *filterJSON) proto(field string) (*dragonv1.RetrievalFilter, error) {
	if f == nil {
		return nil, nil
	}
	out := &dragonv1.RetrievalFilter{SourcePrefix: f.SourcePrefix, From: f.From}
	for name, v := range map[string]string{"after": f.After, "before": f.Before} {
		if v == "" {
			continue
		}
		ts, err := session.FilterTime(v)
		if err != nil {
			return nil, fmt.Errorf("%s.%s %w", field, name, err)
		}
		if name == "after" {
			out.After = ts
		} else {
			out.Before = ts
		}
	}
	return out, nil
}

type chatRequest struct {
	options
	Messages []chatMessage `json:"messages"`
}

type chatMessage struct {
	Role    string  `json:"role"`
	Content content `json:"content"`
}

type completionRequest struct {
	options
	Prompt json.RawMessage `json:"prompt"`
	Echo   bool            `json:"echo"`
	Suffix *string         `json:"suffix"`
}

// badRequest is a request error: HTTP 400 with the field at fault.
type badRequest struct{ msg string }

func (b badRequest) Error() string { return b.msg }

func bad(format string, a ...any) error { return badRequest{fmt.Sprintf(format, a...)} }

// decode reads a JSON body of at most maxBody bytes of valid UTF-8.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return bad("request body larger than %d bytes", maxBody)
		}
		return bad("reading the request: %v", err)
	}
	if !utf8.Valid(body) {
		return bad("request body is not valid UTF-8")
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	if err := dec.Decode(v); err != nil {
		return bad("invalid JSON: %v", err)
	}
	return nil
}

// request turns the shared options into a device request.
func (o *OpenAI) request(opts options, prompt, system string) (*dragonv1.GenerateRequest, error) {
	if opts.Model != o.model {
		return nil, modelNotFound{opts.Model, o.model}
	}
	if opts.N != nil && *opts.N != 1 {
		return nil, bad("n = %d: this server returns one choice", *opts.N)
	}
	sp := &dragonv1.SamplingParams{Temperature: 1, Stop: opts.Stop}
	if opts.Temperature != nil {
		if *opts.Temperature < 0 || *opts.Temperature > 2 {
			return nil, bad("temperature %v is not in [0, 2]", *opts.Temperature)
		}
		sp.Temperature = float32(*opts.Temperature)
	}
	if opts.TopP != nil {
		if *opts.TopP <= 0 || *opts.TopP > 1 {
			return nil, bad("top_p %v is not in (0, 1]", *opts.TopP)
		}
		sp.TopP = float32(*opts.TopP)
	}
	maxTokens := opts.MaxCompletionTokens
	if maxTokens == nil {
		maxTokens = opts.MaxTokens
	}
	if maxTokens != nil {
		if *maxTokens < 1 || int64(*maxTokens) > math.MaxUint32 {
			return nil, bad("max_tokens %d: need 1 to %d", *maxTokens, uint32(math.MaxUint32))
		}
		sp.MaxTokens = uint32(*maxTokens)
	}
	if opts.Seed != nil {
		sp.Seed = uint64(*opts.Seed)
	} else {
		sp.Seed = rand.Uint64()
	}
	g := &dragonv1.GenerateRequest{Prompt: prompt, System: system, Sampling: sp, Progress: opts.Progress && opts.Stream}
	if opts.Mode != "" {
		m, err := session.ParseModeName(opts.Mode)
		if err != nil {
			return nil, bad("%v", err)
		}
		g.Mode = m
	}
	for name, p := range map[string]*int{"passages_device": opts.PassagesDevice, "passages_cloud": opts.PassagesCloud} {
		if p != nil && (*p < 0 || int64(*p) > math.MaxUint32) {
			return nil, bad("%s %d: need 0 to %d", name, *p, uint32(math.MaxUint32))
		}
	}
	if opts.PassagesDevice != nil {
		g.PassagesDevice = uint32(*opts.PassagesDevice)
	}
	if opts.PassagesCloud != nil {
		g.PassagesCloud = uint32(*opts.PassagesCloud)
	}
	if opts.CodecTopP != nil {
		g.CodecTopP = float32(*opts.CodecTopP)
	}
	if opts.ConfidenceTemperature != nil {
		g.ConfidenceTemperature = float32(*opts.ConfidenceTemperature)
	}
	g.OmitSources = opts.IncludeSources != nil && !*opts.IncludeSources
	var err error
	if g.Filter, err = opts.Filter.proto("filter"); err != nil {
		return nil, bad("%v", err)
	}
	if g.CloudFilter, err = opts.CloudFilter.proto("cloud_filter"); err != nil {
		return nil, bad("%v", err)
	}
	if p := opts.PosteriorEvery; p != nil {
		if *p < 0 || *p > session.MaxPosteriorEvery {
			return nil, bad("posterior_every %d: need 0 (off) to %d", *p, session.MaxPosteriorEvery)
		}
		g.PosteriorEvery = proto.Uint32(uint32(*p))
	}
	if opts.Strategy != "" {
		st, err := aggregator.ParseStrategy(opts.Strategy)
		if err != nil {
			return nil, bad("%v", err)
		}
		g.Strategy = session.StrategyToProto(st)
	}
	return g, nil
}

type modelNotFound struct{ asked, served string }

func (m modelNotFound) Error() string {
	return fmt.Sprintf("the model %q does not exist; this device serves %q", m.asked, m.served)
}

func (o *OpenAI) fail(w http.ResponseWriter, err error) {
	var br badRequest
	var mnf modelNotFound
	switch {
	case errors.As(err, &br):
		writeError(w, http.StatusBadRequest, "invalid_request_error", "", br.msg)
	case errors.As(err, &mnf):
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", mnf.Error())
	default:
		writeStatus(w, err)
	}
}

func (o *OpenAI) chat(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if err := decode(w, r, &req); err != nil {
		o.fail(w, err)
		return
	}
	prompt, system, history, err := conversation(req.Messages)
	if err != nil {
		o.fail(w, err)
		return
	}
	g, err := o.request(req.options, prompt, system)
	if err != nil {
		o.fail(w, err)
		return
	}
	g.History = history
	o.run(w, r, req.options, g, "chat.completion")
}

// conversation splits a chat: the last user message is the prompt, the
// user and assistant messages before it the history (so that both sides
// lay out the conversation as it went), system and developer messages the
// system prompt. Tool messages are dropped: this server calls no tools.
func conversation(msgs []chatMessage) (prompt, system string, history []*dragonv1.ChatTurn, err error) {
	last := -1
	var sys []string
	for i, m := range msgs {
		switch m.Role {
		case "system", "developer":
			sys = append(sys, string(m.Content))
		case "user":
			last = i
		case "assistant", "tool":
		default:
			return "", "", nil, bad("messages[%d]: unknown role %q", i, m.Role)
		}
	}
	if last < 0 || msgs[last].Content == "" {
		return "", "", nil, bad("messages: no user message with content")
	}
	for _, m := range msgs[:last] {
		switch m.Role {
		case "user":
			history = append(history, &dragonv1.ChatTurn{Role: dragonv1.ChatRole_CHAT_ROLE_USER, Content: string(m.Content)})
		case "assistant":
			history = append(history, &dragonv1.ChatTurn{Role: dragonv1.ChatRole_CHAT_ROLE_ASSISTANT, Content: string(m.Content)})
		}
	}
	return string(msgs[last].Content), strings.Join(sys, "\n"), history, nil
}

func (o *OpenAI) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if err := decode(w, r, &req); err != nil {
		o.fail(w, err)
		return
	}
	if req.Echo || req.Suffix != nil {
		o.fail(w, bad("echo and suffix are not supported"))
		return
	}
	var prompt string
	if err := json.Unmarshal(req.Prompt, &prompt); err != nil {
		var prompts []string
		if err := json.Unmarshal(req.Prompt, &prompts); err != nil || len(prompts) != 1 {
			o.fail(w, bad("prompt must be a string (or a list of one string)"))
			return
		}
		prompt = prompts[0]
	}
	g, err := o.request(req.options, prompt, "")
	if err != nil {
		o.fail(w, err)
		return
	}
	o.run(w, r, req.options, g, "text_completion")
}

// usage is OpenAI's token accounting: the prompt as the client sent it
// (the passages the sides add are not counted), the answer's tokens.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// usage counts a request's tokens. It tokenizes, so it runs while the
// generation still holds the model (on its summary): afterwards an idle
// unload may have freed it, and tokenizing would load it back for nothing.
func (o *OpenAI) usage(g *dragonv1.GenerateRequest, completion int) usage {
	n := 0
	texts := []string{g.GetSystem(), g.GetPrompt()}
	for _, t := range g.GetHistory() {
		texts = append(texts, t.GetContent()) // the conversation is prompt too
	}
	for _, s := range texts {
		if toks, err := o.srv.cfg.Model.Tokenize(s, false, false); err == nil {
			n += len(toks)
		}
	}
	return usage{PromptTokens: n, CompletionTokens: completion, TotalTokens: n + completion}
}

func finishName(f dragonv1.FinishReason) string {
	if f == dragonv1.FinishReason_FINISH_REASON_LENGTH || f == dragonv1.FinishReason_FINISH_REASON_CONTEXT_FULL {
		return "length"
	}
	return "stop"
}

// run generates and answers, as one JSON object or as server-sent events.
func (o *OpenAI) run(w http.ResponseWriter, r *http.Request, opts options, g *dragonv1.GenerateRequest, object string) {
	id := fmt.Sprintf("dragon-%x", rand.Uint64())
	created := o.clock().Unix()
	chat := object == "chat.completion"
	if !opts.Stream {
		var text strings.Builder
		var sum *dragonv1.GenerateSummary
		var use usage
		err := o.srv.Serve(r.Context(), g, func(m *dragonv1.GenerateResponse) error {
			text.WriteString(m.GetChunk().GetText())
			if s := m.GetSummary(); s != nil {
				sum, use = s, o.usage(g, int(s.GetTokens()))
			}
			return nil
		})
		if err != nil {
			o.fail(w, err)
			return
		}
		choice := map[string]any{"index": 0, "finish_reason": finishName(sum.GetFinishReason()), "logprobs": nil}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text.String()}
		} else {
			choice["text"] = text.String()
		}
		writeJSON(w, map[string]any{
			"id": id, "object": object, "created": created, "model": o.model,
			"choices": []any{choice}, "usage": use, "dragon": NewSummaryJSON(sum), "sources": NewSourcesJSON(sum),
		})
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	chunkObject := object
	if chat {
		chunkObject = "chat.completion.chunk"
	}
	event := func(choice map[string]any, more map[string]any) error {
		c := map[string]any{"id": id, "object": chunkObject, "created": created, "model": o.model}
		if choice != nil {
			c["choices"] = []any{choice}
		} else {
			c["choices"] = []any{}
		}
		for k, v := range more {
			c[k] = v
		}
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	delta := func(text string, first bool) map[string]any {
		if chat {
			d := map[string]any{"content": text}
			if first {
				d["role"] = "assistant"
			}
			return map[string]any{"index": 0, "delta": d, "finish_reason": nil}
		}
		return map[string]any{"index": 0, "text": text, "finish_reason": nil, "logprobs": nil}
	}
	started := false
	var sum *dragonv1.GenerateSummary
	var use usage
	err := o.srv.Serve(r.Context(), g, func(m *dragonv1.GenerateResponse) error {
		if s := m.GetSummary(); s != nil {
			sum, use = s, o.usage(g, int(s.GetTokens()))
			return nil
		}
		if p := m.GetProgress(); p != nil {
			err := event(nil, map[string]any{"dragon_progress": NewProgressJSON(p)})
			started = true
			return err
		}
		text := m.GetChunk().GetText()
		var more map[string]any
		if m.GetChunk().GetFallback() {
			// The device answers alone from here: a page says so now,
			// not only in the summary.
			more = map[string]any{"dragon_fallback": true}
		}
		if text == "" && started && more == nil {
			return nil
		}
		err := event(delta(text, !started), more)
		started = true
		return err
	})
	if err != nil {
		if !started {
			o.fail(w, err)
			return
		}
		st := status.Convert(err)
		b, _ := json.Marshal(map[string]apiError{"error": {Message: st.Message(), Type: "server_error"}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		return
	}
	last := delta("", !started)
	last["finish_reason"] = finishName(sum.GetFinishReason())
	if chat {
		last["delta"] = map[string]any{}
	}
	_ = event(last, map[string]any{"dragon": NewSummaryJSON(sum), "sources": NewSourcesJSON(sum)})
	if opts.StreamOptions != nil && opts.StreamOptions.IncludeUsage {
		_ = event(nil, map[string]any{"usage": use})
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}
