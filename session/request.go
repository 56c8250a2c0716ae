package session

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/wire"
)

// modeNames are the modes as people (the command line, metrics) name them.
var modeNames = []struct {
	name string
	mode dragonv1.Mode
}{
	{"dragon", dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION},
	{"tw", dragonv1.Mode_MODE_TOKEN_WISE_SYNC},
	{"sw", dragonv1.Mode_MODE_SEQUENCE_WISE_SYNC},
	{"device-only", dragonv1.Mode_MODE_DEVICE_ONLY},
	{"cloud-only", dragonv1.Mode_MODE_CLOUD_ONLY},
	{"context", dragonv1.Mode_MODE_CONTEXT},
	{"kv", dragonv1.Mode_MODE_KV},
}

// ParseModeName reads a mode's name (dragon, tw, sw, device-only,
// cloud-only, context, kv).
func ParseModeName(s string) (dragonv1.Mode, error) {
	var names []string
	for _, m := range modeNames {
		if m.name == s {
			return m.mode, nil
		}
		names = append(names, m.name)
	}
	return 0, fmt.Errorf("unknown mode %q (want %s)", s, strings.Join(names, ", "))
}

// ModeNames are the modes' names, as ParseModeName takes them.
func ModeNames() []string {
	out := make([]string, len(modeNames))
	for i, m := range modeNames {
		out[i] = m.name
	}
	return out
}

// ModeName is a mode's name.
func ModeName(m dragonv1.Mode) string {
	for _, n := range modeNames {
		if n.mode == m {
			return n.name
		}
	}
	return m.String()
}

// Retriever finds a side's passages for a query, among those f lets
// through.
type Retriever interface {
	Retrieve(ctx context.Context, query string, k int, f retrieval.Filter) ([]decoder.Passage, error)
}

// IndexRetriever retrieves from an index: a local retrieval.Index or a
// remote one (retrieval.RemoteIndex).
type IndexRetriever struct {
	Index retrieval.Searcher
	Mode  retrieval.Mode
}

// Retrieve implements Retriever.
func (r IndexRetriever) Retrieve(ctx context.Context, query string, k int, f retrieval.Filter) ([]decoder.Passage, error) {
	if k <= 0 || r.Index == nil {
		return nil, nil
	}
	hits, err := retrieval.SearchWith(ctx, r.Index, query, k, r.Mode, f)
	if err != nil {
		return nil, err
	}
	out := make([]decoder.Passage, len(hits))
	for i, h := range hits {
		out[i] = decoder.Passage{
			Text: h.Passage.Text, Score: h.Score, Source: h.Passage.Source,
			ID: h.Passage.ID, Start: h.Passage.Start, End: h.Passage.End, Meta: h.Passage.Meta,
		}
	}
	return out, nil
}

// ClosedBookSource names the closed-book passage among a side's sources.
const ClosedBookSource = "(closed book)"

// ClosedBook adds to Inner's passages the closed-book document (a passage
// without text: the question alone) at relevance Score, whenever a request
// asks this side for passages. Its sequence carries the model's own
// knowledge into the mixture, so a side whose passages are less relevant
// than Score leans on what its model knows rather than on them. Score is on
// the scale of Inner's scores (a cross-encoder's logit with re-ranking).
type ClosedBook struct {
	Inner Retriever
	Score float64
}

// ParseClosedBook reads a closed-book relevance as flags give it: a finite
// number.
func ParseClosedBook(s string) (float64, error) {
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("closed-book relevance %q: want a finite number", s)
	}
	return v, nil
}

// Retrieve implements Retriever.
func (c ClosedBook) Retrieve(ctx context.Context, query string, k int, f retrieval.Filter) ([]decoder.Passage, error) {
	if k <= 0 {
		return nil, nil
	}
	ps, err := c.Inner.Retrieve(ctx, query, k, f)
	if err != nil {
		return nil, err
	}
	return append(ps, decoder.Passage{Score: c.Score, Source: ClosedBookSource}), nil
}

// Limits bound what a request may ask for.
type Limits struct {
	MaxTokens   int // most tokens per answer
	MaxPassages int // most passages per side
	MaxPrompt   int // most bytes of prompt
}

// Request is a generation request as both sides read it from the wire.
type Request struct {
	Query  string
	System string
	// Filter narrows this side's retrieval: on the device its own
	// (GenerateRequest.filter), on the cloud the one the device sent
	// (GenerateRequest.cloud_filter, in Begin).
	Filter retrieval.Filter
	// CloudFilter is, on the device, the filter to send the cloud.
	CloudFilter *dragonv1.RetrievalFilter
	// ownFilter is the device's filter as the app sent it, which only the
	// leak control build sends on.
	ownFilter *dragonv1.RetrievalFilter
	// History is the conversation before Query (user and assistant turns,
	// oldest first).
	History   []engine.Message
	Sampling  sampling.Params
	MaxTokens int
	Stop      []string
	CodecTopP float64
	Mode      dragonv1.Mode
	// Passages each side retrieves.
	PassagesDevice, PassagesCloud int
	Strategy                      aggregator.Strategy
	Aggregator                    aggregator.Side
	SwitchEvery                   int
	BlindDrafts                   bool
	// Confidence is aggregator.Config.Confidence (0: off).
	Confidence float64
	// Hedges and HedgeDepth bound each side's hedged drafts
	// (aggregator.Config.Hedges, HedgeDepth; 0: none).
	Hedges, HedgeDepth int
	// Sources asks for the answer's sources (Options.Sources).
	Sources bool
	// PosteriorEvery is both sides' posterior weights' interval
	// (decoder.SetPosteriorEvery; 0: static weights).
	PosteriorEvery int
}

// Hedge limits a request may ask for: a hedge's branch must reach over a
// round trip (about 75 drafts at 300 ms one way and 8 ms a token).
const (
	MaxHedges     = 16
	MaxHedgeDepth = 1024
)

// Stop strings a request may give: every generated token is checked
// against each of them, so their number and size bound that work (OpenAI's
// API takes 4).
const (
	MaxStops     = 16
	MaxStopBytes = 256
)

// MaxTurns bounds a conversation's earlier turns. The prompt's byte limit
// does not: an answer may be empty, and each turn adds its role markers to
// the prompt every side lays out.
const MaxTurns = 512

// Defaults fill a request's unset fields.
type Defaults struct {
	MaxTokens                     int
	PassagesDevice, PassagesCloud int
	Mode                          dragonv1.Mode
	PosteriorEvery                int
}

// MaxPosteriorEvery bounds a request's posterior interval (a longer one
// than any answer is static weights).
const MaxPosteriorEvery = 1 << 16

// posteriorEvery reads a request's posterior interval: the default where
// it does not say; refused beside hedged drafts (a branch decodes under
// the weights of its fork).
func posteriorEvery(p *uint32, def Defaults, r Request) (int, error) {
	if p == nil {
		if r.Hedges > 0 {
			return 0, nil // the daemon's posterior default yields to hedges the request asked for
		}
		return def.PosteriorEvery, nil
	}
	switch {
	case *p > MaxPosteriorEvery:
		return 0, wire.InvalidArgument("posterior_every", fmt.Sprintf("%d: at most %d", *p, MaxPosteriorEvery))
	case *p > 0 && r.Hedges > 0:
		return 0, wire.InvalidArgument("posterior_every", "hedged drafts need static weights: ask for one or the other")
	}
	return int(*p), nil
}

// ParseSampling reads and checks sampling parameters; field names the
// request field for errors.
func ParseSampling(p *dragonv1.SamplingParams, lim Limits, def Defaults) (sampling.Params, int, []string, error) {
	sp := sampling.Params{
		Temperature: float64(p.GetTemperature()), TopK: int(p.GetTopK()), TopP: float64(p.GetTopP()),
		MinP: float64(p.GetMinP()), RepeatPenalty: float64(p.GetRepetitionPenalty()), Seed: p.GetSeed(),
	}
	for name, v := range map[string]float32{"temperature": p.GetTemperature(), "top_p": p.GetTopP(), "min_p": p.GetMinP(), "repetition_penalty": p.GetRepetitionPenalty()} {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return sp, 0, nil, wire.InvalidArgument("sampling."+name, "not a number")
		}
	}
	if err := sp.Validate(); err != nil {
		return sp, 0, nil, wire.InvalidArgument("sampling", err.Error())
	}
	maxTokens := int(p.GetMaxTokens())
	if maxTokens == 0 {
		maxTokens = def.MaxTokens
	}
	if lim.MaxTokens > 0 && maxTokens > lim.MaxTokens {
		return sp, 0, nil, wire.InvalidArgument("sampling.max_tokens", fmt.Sprintf("%d is more than the limit of %d", maxTokens, lim.MaxTokens))
	}
	if n := len(p.GetStop()); n > MaxStops {
		return sp, 0, nil, wire.InvalidArgument("sampling.stop", fmt.Sprintf("%d stop strings: at most %d", n, MaxStops))
	}
	for _, s := range p.GetStop() {
		switch {
		case s == "":
			return sp, 0, nil, wire.InvalidArgument("sampling.stop", "empty stop string")
		case len(s) > MaxStopBytes:
			return sp, 0, nil, wire.InvalidArgument("sampling.stop", fmt.Sprintf("a stop string of %d bytes: at most %d", len(s), MaxStopBytes))
		}
	}
	return sp, maxTokens, p.GetStop(), nil
}

// ParseBegin reads and checks a Begin (on the cloud).
func ParseBegin(b *dragonv1.Begin, lim Limits, def Defaults) (Request, error) {
	r := Request{
		Query: b.GetQuery(), System: b.GetSystem(), Mode: b.GetMode(), SwitchEvery: int(b.GetSwitchEvery()),
		BlindDrafts: b.GetBlindDrafts(), Sources: b.GetSources(),
	}
	var err error
	if r.Sampling, r.MaxTokens, r.Stop, err = ParseSampling(b.GetSampling(), lim, def); err != nil {
		return r, err
	}
	if err := checkPrompt(r.Query, "query", lim); err != nil {
		return r, err
	}
	if r.History, err = parseHistory(b.GetHistory(), r.Query, lim); err != nil {
		return r, err
	}
	if err := checkSystem(r.System, lim); err != nil {
		return r, err
	}
	if r.Filter, err = ParseFilter(b.GetFilter(), "filter"); err != nil {
		return r, err
	}
	if r.Mode == dragonv1.Mode_MODE_UNSPECIFIED {
		r.Mode = dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION
	}
	if _, ok := dragonv1.Mode_name[int32(r.Mode)]; !ok {
		return r, wire.InvalidArgument("mode", fmt.Sprintf("unknown mode %d", r.Mode))
	}
	if r.PassagesDevice, r.PassagesCloud, err = passages(b.GetPassagesDevice(), b.GetPassagesCloud(), lim, def); err != nil {
		return r, err
	}
	if r.CodecTopP, err = codecTopP(b.GetCodecTopP()); err != nil {
		return r, err
	}
	if r.Strategy, err = ParseStrategy(b.GetStrategy()); err != nil {
		return r, err
	}
	if r.Aggregator, err = parseFirst(b.GetAggregator()); err != nil {
		return r, err
	}
	if r.Confidence, err = confidence(b.GetConfidenceTemperature()); err != nil {
		return r, err
	}
	if r.Hedges, r.HedgeDepth, err = hedges(b.GetMaxHedges(), b.GetHedgeDepth(), r); err != nil {
		return r, err
	}
	if r.PosteriorEvery, err = posteriorEvery(b.PosteriorEvery, def, r); err != nil {
		return r, err
	}
	return r, nil
}

// hedges checks the hedge limits of r.
func hedges(n, depth uint32, r Request) (int, int, error) {
	switch {
	case n == 0:
		return 0, 0, nil
	case n > MaxHedges:
		return 0, 0, wire.InvalidArgument("max_hedges", fmt.Sprintf("%d: at most %d", n, MaxHedges))
	case depth == 0 || depth > MaxHedgeDepth:
		return 0, 0, wire.InvalidArgument("hedge_depth", fmt.Sprintf("%d with %d hedges: want 1 to %d", depth, n, MaxHedgeDepth))
	case r.BlindDrafts || r.Mode != dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION:
		return 0, 0, wire.InvalidArgument("max_hedges", "hedged drafts need speculative aggregation with shared drafts")
	}
	return int(n), int(depth), nil
}

// confidence checks a confidence temperature.
func confidence(v float32) (float64, error) {
	if !aggregator.ValidConfidence(float64(v)) {
		return 0, wire.InvalidArgument("confidence_temperature", fmt.Sprintf("%v: want 0 (off) or a positive number", v))
	}
	return float64(v), nil
}

// ParseGenerate reads and checks an app's request (on the device).
func ParseGenerate(g *dragonv1.GenerateRequest, lim Limits, def Defaults) (Request, error) {
	r := Request{
		Query: g.GetPrompt(), System: g.GetSystem(), Mode: g.GetMode(), SwitchEvery: int(g.GetSwitchEvery()),
		BlindDrafts: g.GetBlindDrafts(), Sources: !g.GetOmitSources(),
	}
	var err error
	if r.Sampling, r.MaxTokens, r.Stop, err = ParseSampling(g.GetSampling(), lim, def); err != nil {
		return r, err
	}
	if err := checkPrompt(r.Query, "prompt", lim); err != nil {
		return r, err
	}
	if r.History, err = parseHistory(g.GetHistory(), r.Query, lim); err != nil {
		return r, err
	}
	if err := checkSystem(r.System, lim); err != nil {
		return r, err
	}
	if r.Filter, err = ParseFilter(g.GetFilter(), "filter"); err != nil {
		return r, err
	}
	if _, err = ParseFilter(g.GetCloudFilter(), "cloud_filter"); err != nil {
		return r, err
	}
	r.CloudFilter, r.ownFilter = g.GetCloudFilter(), g.GetFilter()
	if r.Mode == dragonv1.Mode_MODE_UNSPECIFIED {
		r.Mode = def.Mode
	}
	if _, ok := dragonv1.Mode_name[int32(r.Mode)]; !ok || r.Mode == dragonv1.Mode_MODE_UNSPECIFIED {
		return r, wire.InvalidArgument("mode", fmt.Sprintf("unknown mode %d", r.Mode))
	}
	if r.Hedges, r.HedgeDepth, err = hedges(g.GetMaxHedges(), g.GetHedgeDepth(), r); err != nil {
		return r, err
	}
	if r.PassagesDevice, r.PassagesCloud, err = passages(g.GetPassagesDevice(), g.GetPassagesCloud(), lim, def); err != nil {
		return r, err
	}
	if r.CodecTopP, err = codecTopP(g.GetCodecTopP()); err != nil {
		return r, err
	}
	if r.Strategy, err = ParseStrategy(g.GetStrategy()); err != nil {
		return r, err
	}
	if r.Aggregator, err = parseFirst(g.GetAggregator()); err != nil {
		return r, err
	}
	if r.Confidence, err = confidence(g.GetConfidenceTemperature()); err != nil {
		return r, err
	}
	if r.PosteriorEvery, err = posteriorEvery(g.PosteriorEvery, def, r); err != nil {
		return r, err
	}
	return r, nil
}

func checkPrompt(s, field string, lim Limits) error {
	switch {
	case s == "":
		return wire.InvalidArgument(field, "empty")
	case lim.MaxPrompt > 0 && len(s) > lim.MaxPrompt:
		return wire.InvalidArgument(field, fmt.Sprintf("%d bytes, more than the limit of %d", len(s), lim.MaxPrompt))
	}
	return nil
}

// checkSystem bounds a system message as a prompt is bounded: the device
// checks an app's, the cloud a peer's.
func checkSystem(s string, lim Limits) error {
	if lim.MaxPrompt > 0 && len(s) > lim.MaxPrompt {
		return wire.InvalidArgument("system", fmt.Sprintf("%d bytes, more than the limit of %d", len(s), lim.MaxPrompt))
	}
	return nil
}

// MaxFilterBytes bounds a filter's strings.
const MaxFilterBytes = 1024

// ParseFilter reads a retrieval filter from the wire (nil: none); field
// names the request's field in errors.
func ParseFilter(f *dragonv1.RetrievalFilter, field string) (retrieval.Filter, error) {
	var out retrieval.Filter
	if f == nil {
		return out, nil
	}
	if len(f.GetSourcePrefix()) > MaxFilterBytes || len(f.GetFrom()) > MaxFilterBytes {
		return out, wire.InvalidArgument(field, fmt.Sprintf("a filter string over %d bytes", MaxFilterBytes))
	}
	out.SourcePrefix, out.From = f.GetSourcePrefix(), f.GetFrom()
	for name, ts := range map[string]*timestamppb.Timestamp{"after": f.GetAfter(), "before": f.GetBefore()} {
		if ts == nil {
			continue
		}
		if err := ts.CheckValid(); err != nil {
			return out, wire.InvalidArgument(field+"."+name, err.Error())
		}
		if name == "after" {
			out.After = ts.AsTime()
		} else {
			out.Before = ts.AsTime()
		}
	}
	if err := out.Validate(); err != nil {
		return out, wire.InvalidArgument(field, err.Error())
	}
	return out, nil
}

// FilterTime reads a filter's bound as people write it: an RFC 3339 time
// or a day (2006-01-02, midnight UTC).
func FilterTime(s string) (*timestamppb.Timestamp, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		if t, err = time.Parse("2006-01-02", s); err != nil {
			return nil, fmt.Errorf("%q: want a day (2006-01-02) or an RFC 3339 time", s)
		}
	}
	return timestamppb.New(t), nil
}

// retrievalTurns is how many of a conversation's earlier user turns join
// its last message in the retrieval query.
const retrievalTurns = 2

// RetrievalQuery is what a side retrieves with for a request: its last
// message and, in a conversation, the user's turns before it (up to
// retrievalTurns), so that a follow-up ("and what did he say about the
// price?") finds what the conversation is about. Answers are left out:
// they are the model's words, not the user's.
func RetrievalQuery(r Request) string {
	var turns []string
	for i := len(r.History) - 1; i >= 0 && len(turns) < retrievalTurns; i-- {
		if m := r.History[i]; m.Role == engine.RoleUser {
			turns = append(turns, m.Content)
		}
	}
	if len(turns) == 0 {
		return r.Query
	}
	slices.Reverse(turns)
	return strings.Join(append(turns, r.Query), "\n")
}

// parseHistory reads a conversation's earlier turns. An answer may be empty
// (the model may have ended it at once), a question may not. The turns and
// the query are all prompt: together they stay within lim.MaxPrompt.
func parseHistory(turns []*dragonv1.ChatTurn, query string, lim Limits) ([]engine.Message, error) {
	switch {
	case len(turns) == 0:
		return nil, nil
	case len(turns) > MaxTurns:
		return nil, wire.InvalidArgument("history", fmt.Sprintf("%d turns: at most %d", len(turns), MaxTurns))
	}
	h := make([]engine.Message, len(turns))
	size := len(query)
	for i, t := range turns {
		switch t.GetRole() {
		case dragonv1.ChatRole_CHAT_ROLE_USER:
			if t.GetContent() == "" {
				return nil, wire.InvalidArgument(fmt.Sprintf("history[%d].content", i), "empty question")
			}
			h[i].Role = engine.RoleUser
		case dragonv1.ChatRole_CHAT_ROLE_ASSISTANT:
			h[i].Role = engine.RoleAssistant
		default:
			return nil, wire.InvalidArgument(fmt.Sprintf("history[%d].role", i), fmt.Sprintf("%v: want user or assistant", t.GetRole()))
		}
		h[i].Content = t.GetContent()
		size += len(t.GetContent())
	}
	if lim.MaxPrompt > 0 && size > lim.MaxPrompt {
		return nil, wire.InvalidArgument("history", fmt.Sprintf("%d bytes with the prompt, more than the limit of %d", size, lim.MaxPrompt))
	}
	return h, nil
}

// historyToProto is the wire form of a conversation's earlier turns.
func historyToProto(h []engine.Message) []*dragonv1.ChatTurn {
	var turns []*dragonv1.ChatTurn
	for _, m := range h {
		role := dragonv1.ChatRole_CHAT_ROLE_USER
		if m.Role == engine.RoleAssistant {
			role = dragonv1.ChatRole_CHAT_ROLE_ASSISTANT
		}
		turns = append(turns, &dragonv1.ChatTurn{Role: role, Content: m.Content})
	}
	return turns
}

func passages(dev, cld uint32, lim Limits, def Defaults) (int, int, error) {
	d, c := int(dev), int(cld)
	if d == 0 {
		d = def.PassagesDevice
	}
	if c == 0 {
		c = def.PassagesCloud
	}
	if lim.MaxPassages > 0 && (d > lim.MaxPassages || c > lim.MaxPassages) {
		return 0, 0, wire.InvalidArgument("passages", fmt.Sprintf("%d and %d passages, at most %d per side", d, c, lim.MaxPassages))
	}
	return d, c, nil
}

func codecTopP(p float32) (float64, error) {
	if p == 0 {
		return 0, nil
	}
	if !(p > 0 && p <= 1) {
		return 0, wire.InvalidArgument("codec_top_p", fmt.Sprintf("%v is not in (0, 1]", p))
	}
	return float64(p), nil
}

// ParseStrategy maps the wire's strategy (unspecified: greedy).
func ParseStrategy(s dragonv1.Strategy) (aggregator.Strategy, error) {
	switch s {
	case dragonv1.Strategy_STRATEGY_UNSPECIFIED, dragonv1.Strategy_STRATEGY_GREEDY:
		return aggregator.Greedy, nil
	case dragonv1.Strategy_STRATEGY_DEVICE:
		return aggregator.StaticDevice, nil
	case dragonv1.Strategy_STRATEGY_CLOUD:
		return aggregator.StaticCloud, nil
	case dragonv1.Strategy_STRATEGY_RANDOM:
		return aggregator.Random, nil
	}
	return 0, wire.InvalidArgument("strategy", fmt.Sprintf("unknown strategy %d", s))
}

// StrategyToProto is the wire form of a strategy.
func StrategyToProto(s aggregator.Strategy) dragonv1.Strategy {
	switch s {
	case aggregator.StaticDevice:
		return dragonv1.Strategy_STRATEGY_DEVICE
	case aggregator.StaticCloud:
		return dragonv1.Strategy_STRATEGY_CLOUD
	case aggregator.Random:
		return dragonv1.Strategy_STRATEGY_RANDOM
	}
	return dragonv1.Strategy_STRATEGY_GREEDY
}

func parseFirst(s dragonv1.Side) (aggregator.Side, error) {
	switch s {
	case dragonv1.Side_SIDE_UNSPECIFIED, dragonv1.Side_SIDE_DEVICE:
		return aggregator.Device, nil
	case dragonv1.Side_SIDE_CLOUD:
		return aggregator.Cloud, nil
	}
	return 0, wire.InvalidArgument("aggregator", fmt.Sprintf("unknown side %d", s))
}

// ToSide is the wire form of a side.
func ToSide(s aggregator.Side) dragonv1.Side { return toSide(s) }

// Options are the session options of a request on side self.
func (r Request) Options(self aggregator.Side, id uint64) Options {
	o := Options{
		Self: self, SessionID: id, Owner: self == aggregator.Device, Sampling: r.Sampling, MaxTokens: r.MaxTokens,
		CodecTopP: r.CodecTopP, Aggregator: r.Aggregator, Strategy: r.Strategy, SwitchEvery: r.SwitchEvery,
		Blind: r.BlindDrafts, Confidence: r.Confidence, Hedges: r.Hedges, HedgeDepth: r.HedgeDepth, Sources: r.Sources,
	}
	if r.Mode == dragonv1.Mode_MODE_TOKEN_WISE_SYNC {
		o.Sync = TokenWise
	}
	return o
}

// Begin is the wire form of the request, for the cloud.
func (r Request) Begin(id uint64) *dragonv1.Begin {
	stop := r.Stop
	b := &dragonv1.Begin{
		SessionId: id, Query: r.Query, System: r.System, History: historyToProto(r.History), Mode: r.Mode,
		Sampling: &dragonv1.SamplingParams{
			Temperature: float32(r.Sampling.Temperature), TopK: uint32(r.Sampling.TopK), TopP: float32(r.Sampling.TopP),
			MinP: float32(r.Sampling.MinP), RepetitionPenalty: float32(r.Sampling.RepeatPenalty), Seed: r.Sampling.Seed,
			MaxTokens: uint32(r.MaxTokens), Stop: stop,
		},
		PassagesDevice: uint32(r.PassagesDevice), PassagesCloud: uint32(r.PassagesCloud),
		CodecTopP: float32(r.CodecTopP), Aggregator: toSide(r.Aggregator), Strategy: StrategyToProto(r.Strategy),
		SwitchEvery: uint32(r.SwitchEvery), BlindDrafts: r.BlindDrafts, ConfidenceTemperature: float32(r.Confidence), Sources: r.Sources,
		MaxHedges: uint32(r.Hedges), HedgeDepth: uint32(r.HedgeDepth), PosteriorEvery: proto.Uint32(uint32(r.PosteriorEvery)),
		// The cloud's filter only: the device's own stays here.
		Filter: r.CloudFilter,
	}
	if leakSources && r.ownFilter != nil {
		b.Filter = r.ownFilter
	}
	return b
}
