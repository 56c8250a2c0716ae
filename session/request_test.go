package session

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
)

// The limits and defaults the request tests parse under.
var (
	testLimits   = Limits{MaxTokens: 64, MaxPassages: 4, MaxPrompt: 200}
	testDefaults = Defaults{MaxTokens: 16, PassagesDevice: 2, PassagesCloud: 2, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
)

// TestRequestReachesBothSidesOptions: what an app asks for reaches the
// device's session options and, through the Begin, the cloud's.
func TestRequestReachesBothSidesOptions(t *testing.T) {
	lim, def := testLimits, testDefaults
	for _, g := range []*dragonv1.GenerateRequest{
		{Prompt: "q", SwitchEvery: 3, BlindDrafts: true, Strategy: dragonv1.Strategy_STRATEGY_CLOUD},
		{Prompt: "q", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC, Sampling: &dragonv1.SamplingParams{MaxTokens: 40, Seed: 9}, ConfidenceTemperature: 0.5},
		{Prompt: "q", MaxHedges: 2, HedgeDepth: 80},
	} {
		dev, err := ParseGenerate(g, lim, def)
		require.NoError(t, err)
		cld, err := ParseBegin(dev.Begin(7), lim, def)
		require.NoError(t, err)
		for _, side := range aggregator.Sides {
			r := dev
			if side == aggregator.Cloud {
				r = cld
			}
			o := r.Options(side, 7)
			assert.Equal(t, g.GetBlindDrafts(), o.Blind, "%v", side)
			assert.Equal(t, int(g.GetSwitchEvery()), o.SwitchEvery, "%v", side)
			assert.Equal(t, g.GetSampling().GetSeed(), o.Sampling.Seed, "%v", side)
			assert.Equal(t, max(int(g.GetSampling().GetMaxTokens()), def.MaxTokens), o.MaxTokens, "%v", side)
			assert.Equal(t, g.GetMode() == dragonv1.Mode_MODE_TOKEN_WISE_SYNC, o.Sync == TokenWise, "%v", side)
			assert.InDelta(t, g.GetConfidenceTemperature(), o.Confidence, 1e-9, "%v", side)
			assert.Equal(t, int(g.GetMaxHedges()), o.Hedges, "%v", side)
			assert.Equal(t, int(g.GetHedgeDepth()), o.HedgeDepth, "%v", side)
		}
		assert.Equal(t, dev.Strategy, cld.Strategy)
	}
}

// TestConfidenceTemperatureChecked: a negative or non-finite confidence
// temperature is refused on either side.
func TestConfidenceTemperatureChecked(t *testing.T) {
	lim, def := testLimits, testDefaults
	for _, v := range []float32{-1, float32(math.NaN()), float32(math.Inf(1))} {
		_, err := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "q", ConfidenceTemperature: v}, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v: %v", v, err)
		assert.ErrorContains(t, err, "confidence_temperature")
		_, err = ParseBegin(&dragonv1.Begin{Query: "q", ConfidenceTemperature: v}, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v: %v", v, err)
	}
}

// TestPosteriorEvery: a request's posterior interval reaches both sides;
// where it does not say, the device's default does (the cloud's only for
// a Begin without one); too long an interval, or one beside hedges, is
// refused on either side.
func TestPosteriorEvery(t *testing.T) {
	lim, def := testLimits, testDefaults
	def.PosteriorEvery = 3
	for name, c := range map[string]struct {
		ask  *uint32
		want int
	}{
		"the default": {nil, 3},
		"off":         {proto.Uint32(0), 0},
		"every token": {proto.Uint32(1), 1},
	} {
		dev, err := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "q", PosteriorEvery: c.ask}, lim, def)
		require.NoError(t, err, name)
		assert.Equal(t, c.want, dev.PosteriorEvery, name)
		cloudDef := def
		cloudDef.PosteriorEvery = 7 // the device's value wins
		cld, err := ParseBegin(dev.Begin(1), lim, cloudDef)
		require.NoError(t, err, name)
		assert.Equal(t, c.want, cld.PosteriorEvery, name)
	}
	cld, err := ParseBegin(&dragonv1.Begin{Query: "q"}, lim, def)
	require.NoError(t, err)
	assert.Equal(t, 3, cld.PosteriorEvery, "an older device's Begin: the cloud's default")
	hedged, err := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "q", MaxHedges: 2, HedgeDepth: 8}, lim, def)
	require.NoError(t, err)
	assert.Zero(t, hedged.PosteriorEvery, "hedges asked for: the default yields")
	for name, g := range map[string]*dragonv1.GenerateRequest{
		"too long":      {Prompt: "q", PosteriorEvery: proto.Uint32(MaxPosteriorEvery + 1)},
		"beside hedges": {Prompt: "q", PosteriorEvery: proto.Uint32(2), MaxHedges: 2, HedgeDepth: 8},
	} {
		_, err := ParseGenerate(g, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		assert.ErrorContains(t, err, "posterior_every", name)
		_, err = ParseBegin(&dragonv1.Begin{Query: "q", PosteriorEvery: g.PosteriorEvery, MaxHedges: g.GetMaxHedges(), HedgeDepth: g.GetHedgeDepth()}, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
}

// TestHedgeLimitsChecked: hedges beyond the limits, without a depth, or
// where drafts are not shared are refused on either side.
func TestHedgeLimitsChecked(t *testing.T) {
	lim, def := testLimits, testDefaults
	for _, c := range []struct {
		name        string
		hedges, dep uint32
		blind       bool
		mode        dragonv1.Mode
		field       string
	}{
		{"too many", MaxHedges + 1, 8, false, 0, "max_hedges"},
		{"no depth", 2, 0, false, 0, "hedge_depth"},
		{"too deep", 2, MaxHedgeDepth + 1, false, 0, "hedge_depth"},
		{"blind drafts", 2, 8, true, 0, "max_hedges"},
		{"token-wise", 2, 8, false, dragonv1.Mode_MODE_TOKEN_WISE_SYNC, "max_hedges"},
	} {
		_, err := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "q", MaxHedges: c.hedges, HedgeDepth: c.dep, BlindDrafts: c.blind, Mode: c.mode}, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", c.name, err)
		assert.ErrorContains(t, err, c.field, c.name)
		_, err = ParseBegin(&dragonv1.Begin{Query: "q", MaxHedges: c.hedges, HedgeDepth: c.dep, BlindDrafts: c.blind, Mode: c.mode}, lim, def)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", c.name, err)
	}
}

// TestStopStringsChecked: every token is matched against each stop
// string, so both sides refuse too many or too long ones, and take those
// at the limits.
func TestStopStringsChecked(t *testing.T) {
	lim, def := testLimits, testDefaults
	for _, c := range []struct {
		name string
		stop []string
		ok   bool
	}{
		{"at the limits", append(slices.Repeat([]string{"x"}, MaxStops-1), strings.Repeat("y", MaxStopBytes)), true},
		{"too many", slices.Repeat([]string{"x"}, MaxStops+1), false},
		{"too long", []string{"\n", strings.Repeat("y", MaxStopBytes+1)}, false},
		{"empty", []string{""}, false},
	} {
		sp := &dragonv1.SamplingParams{Stop: c.stop}
		_, gerr := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "q", Sampling: sp}, lim, def)
		_, berr := ParseBegin(&dragonv1.Begin{Query: "q", Sampling: sp}, lim, def)
		for side, err := range map[string]error{"device": gerr, "cloud": berr} {
			if c.ok {
				assert.NoError(t, err, "%s, %s", c.name, side)
				continue
			}
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%s, %s: %v", c.name, side, err)
			assert.ErrorContains(t, err, "sampling.stop", "%s, %s", c.name, side)
		}
	}
}

func turn(role dragonv1.ChatRole, content string) *dragonv1.ChatTurn {
	return &dragonv1.ChatTurn{Role: role, Content: content}
}

// TestHistoryReachesTheCloud: a conversation's earlier turns, as an app
// sends them, reach the device's request and, through the Begin, the
// cloud's, in order and unchanged, so that both sides lay out the same
// conversation.
func TestHistoryReachesTheCloud(t *testing.T) {
	lim, def := testLimits, testDefaults
	user, assistant := dragonv1.ChatRole_CHAT_ROLE_USER, dragonv1.ChatRole_CHAT_ROLE_ASSISTANT
	cases := []struct {
		name    string
		history []*dragonv1.ChatTurn
		want    []engine.Message
	}{
		{"none", nil, nil},
		{"two turns", []*dragonv1.ChatTurn{turn(user, "Who lit the lamp?"), turn(assistant, "The keeper."), turn(user, "Why?"), turn(assistant, "")},
			[]engine.Message{{Role: engine.RoleUser, Content: "Who lit the lamp?"}, {Role: engine.RoleAssistant, Content: "The keeper."},
				{Role: engine.RoleUser, Content: "Why?"}, {Role: engine.RoleAssistant, Content: ""}}},
		{"greeting first", []*dragonv1.ChatTurn{turn(assistant, "Hello!")}, []engine.Message{{Role: engine.RoleAssistant, Content: "Hello!"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev, err := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "When?", History: tc.history}, lim, def)
			require.NoError(t, err)
			assert.Equal(t, tc.want, dev.History)
			cld, err := ParseBegin(dev.Begin(7), lim, def)
			require.NoError(t, err)
			assert.Equal(t, tc.want, cld.History)
		})
	}
}

// TestHistoryRefused: a turn of no known role, an empty question, and a
// conversation longer than the prompt limit are refused as invalid
// arguments naming the field, by both sides.
func TestHistoryRefused(t *testing.T) {
	lim := Limits{MaxTokens: 64, MaxPassages: 4, MaxPrompt: 20}
	def := Defaults{MaxTokens: 16, Mode: dragonv1.Mode_MODE_DEVICE_ONLY}
	user, assistant := dragonv1.ChatRole_CHAT_ROLE_USER, dragonv1.ChatRole_CHAT_ROLE_ASSISTANT
	cases := []struct {
		name    string
		history []*dragonv1.ChatTurn
		field   string
	}{
		{"unspecified role", []*dragonv1.ChatTurn{turn(user, "a"), turn(dragonv1.ChatRole_CHAT_ROLE_UNSPECIFIED, "b")}, "history[1].role"},
		{"unknown role", []*dragonv1.ChatTurn{turn(dragonv1.ChatRole(7), "a")}, "history[0].role"},
		{"empty question", []*dragonv1.ChatTurn{turn(assistant, "hi"), turn(user, "")}, "history[1].content"},
		// 8 + 8 bytes of turns and 5 of prompt: each fits, together not.
		{"too long", []*dragonv1.ChatTurn{turn(user, strings.Repeat("q", 8)), turn(assistant, strings.Repeat("a", 8))}, "history"},
		{"too many turns", slices.Repeat([]*dragonv1.ChatTurn{turn(assistant, "")}, MaxTurns+1), "history"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, gerr := ParseGenerate(&dragonv1.GenerateRequest{Prompt: "When?", History: tc.history}, lim, def)
			_, berr := ParseBegin(&dragonv1.Begin{Query: "When?", History: tc.history}, lim, def)
			for side, err := range map[string]error{"device": gerr, "cloud": berr} {
				st := status.Convert(err)
				require.Equal(t, codes.InvalidArgument, st.Code(), "%s: %v", side, err)
				require.Len(t, st.Details(), 1, side)
				br, ok := st.Details()[0].(*errdetails.BadRequest)
				require.True(t, ok, side)
				assert.Equal(t, tc.field, br.GetFieldViolations()[0].GetField(), side)
			}
		})
	}
}

// fixedRetriever returns its passages, at most k of them.
type fixedRetriever []decoder.Passage

func (f fixedRetriever) Retrieve(_ context.Context, _ string, k int, _ retrieval.Filter) ([]decoder.Passage, error) {
	return slices.Clone(f[:min(k, len(f))]), nil
}

type failingRetriever struct{}

func (failingRetriever) Retrieve(context.Context, string, int, retrieval.Filter) ([]decoder.Passage, error) {
	return nil, errors.New("index down")
}

func TestClosedBookJoinsEveryRetrieval(t *testing.T) {
	corpus := fixedRetriever{{Text: "a", Score: 3}, {Text: "b", Score: -2}}
	closed := decoder.Passage{Score: 0.5, Source: ClosedBookSource}
	cases := []struct {
		name  string
		inner Retriever
		k     int
		want  []decoder.Passage
	}{
		{"after the passages", corpus, 2, []decoder.Passage{corpus[0], corpus[1], closed}},
		{"k bounds the passages, not the closed book", corpus, 1, []decoder.Passage{corpus[0], closed}},
		{"an empty corpus still has the model", fixedRetriever{}, 2, []decoder.Passage{closed}},
		{"no retrieval asked: nothing", corpus, 0, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ClosedBook{Inner: c.inner, Score: 0.5}.Retrieve(context.Background(), "q", c.k, retrieval.Filter{})
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	_, err := ClosedBook{Inner: failingRetriever{}, Score: 0.5}.Retrieve(context.Background(), "q", 2, retrieval.Filter{})
	assert.ErrorContains(t, err, "index down", "a failed retrieval is not papered over by the closed book")
}

func TestParseClosedBook(t *testing.T) {
	for _, c := range []struct {
		in   string
		want float64
		ok   bool
	}{
		{"0", 0, true}, {"-2.5", -2.5, true}, {"1e1", 10, true},
		{"", 0, false}, {"even", 0, false}, {"NaN", 0, false}, {"Inf", 0, false}, {"-inf", 0, false},
	} {
		got, err := ParseClosedBook(c.in)
		if !c.ok {
			assert.ErrorContains(t, err, "want a finite number", "%q", c.in)
			continue
		}
		require.NoError(t, err, "%q", c.in)
		assert.Equal(t, c.want, got, "%q", c.in)
	}
}

// FuzzParseRequests: whatever bytes an app (GenerateRequest) or a peer
// device (Begin) sends, parsing ends in a request within the limits or in
// an InvalidArgument, never a panic; and a request the device accepts, the
// cloud accepts as the device forwards it, with the same meaning.
func FuzzParseRequests(f *testing.F) {
	lim, def := testLimits, testDefaults
	for _, g := range []*dragonv1.GenerateRequest{
		{Prompt: "q", System: "s", SwitchEvery: 3, BlindDrafts: true, Strategy: dragonv1.Strategy_STRATEGY_CLOUD},
		{Prompt: "q", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC, CodecTopP: 0.9, Sampling: &dragonv1.SamplingParams{MaxTokens: 40, Seed: 9, Temperature: 0.7, TopK: 40, TopP: 0.95, Stop: []string{"\n"}}, ConfidenceTemperature: 0.5},
		{Prompt: "q", MaxHedges: 2, HedgeDepth: 80, Aggregator: dragonv1.Side_SIDE_CLOUD, PassagesDevice: 4, PassagesCloud: 1},
		{Prompt: "q", History: []*dragonv1.ChatTurn{{Role: dragonv1.ChatRole_CHAT_ROLE_USER, Content: "a"}, {Role: dragonv1.ChatRole_CHAT_ROLE_ASSISTANT}}},
		{Prompt: "q", PosteriorEvery: proto.Uint32(4), OmitSources: true},
	} {
		b, err := proto.Marshal(g)
		require.NoError(f, err)
		f.Add(b)
	}
	// A peer's Begin with a system message beyond the prompt limit.
	b, err := proto.Marshal(&dragonv1.Begin{Query: "q", System: strings.Repeat("s", lim.MaxPrompt+1)})
	require.NoError(f, err)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var g dragonv1.GenerateRequest
		if proto.Unmarshal(b, &g) == nil {
			dev, err := ParseGenerate(&g, lim, def)
			if !refused(t, err) {
				withinLimits(t, dev, lim)
				cld, err := ParseBegin(dev.Begin(7), lim, def)
				require.NoError(t, err, "the cloud refuses what the device accepted")
				require.Equal(t, dev.Query, cld.Query)
				require.Equal(t, dev.System, cld.System)
				require.Equal(t, dev.History, cld.History)
				require.Equal(t, dev.Stop, cld.Stop)
				require.Equal(t, dev.PosteriorEvery, cld.PosteriorEvery, "both sides weigh at the same positions")
				for _, side := range aggregator.Sides {
					require.Equal(t, dev.Options(side, 7), cld.Options(side, 7), "%v", side)
				}
			}
		}
		var beg dragonv1.Begin
		if proto.Unmarshal(b, &beg) == nil {
			r, err := ParseBegin(&beg, lim, def)
			if !refused(t, err) {
				withinLimits(t, r, lim)
			}
		}
	})
}

// refused says whether err refuses a request, failing t unless it does so
// as InvalidArgument.
func refused(t *testing.T, err error) bool {
	t.Helper()
	if err == nil {
		return false
	}
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	return true
}

func withinLimits(t *testing.T, r Request, lim Limits) {
	t.Helper()
	require.NotEmpty(t, r.Query)
	size := len(r.Query)
	for _, m := range r.History {
		size += len(m.Content)
	}
	require.LessOrEqual(t, size, lim.MaxPrompt, "query and history")
	require.LessOrEqual(t, len(r.System), lim.MaxPrompt, "system")
	require.NoError(t, r.Sampling.Validate())
	require.LessOrEqual(t, len(r.History), MaxTurns)
	require.LessOrEqual(t, len(r.Stop), MaxStops)
	for _, s := range r.Stop {
		require.NotEmpty(t, s)
		require.LessOrEqual(t, len(s), MaxStopBytes)
	}
	require.Positive(t, r.MaxTokens)
	require.LessOrEqual(t, r.MaxTokens, lim.MaxTokens)
	require.NotEqual(t, dragonv1.Mode_MODE_UNSPECIFIED, r.Mode)
	require.Contains(t, dragonv1.Mode_name, int32(r.Mode))
	for _, n := range []int{r.PassagesDevice, r.PassagesCloud} {
		require.GreaterOrEqual(t, n, 0)
		require.LessOrEqual(t, n, lim.MaxPassages)
	}
	require.GreaterOrEqual(t, r.CodecTopP, 0.0)
	require.LessOrEqual(t, r.CodecTopP, 1.0)
	require.True(t, aggregator.ValidConfidence(r.Confidence), "confidence %v", r.Confidence)
	require.LessOrEqual(t, r.Hedges, MaxHedges)
	if r.Hedges > 0 {
		require.GreaterOrEqual(t, r.HedgeDepth, 1)
		require.LessOrEqual(t, r.HedgeDepth, MaxHedgeDepth)
		require.Equal(t, dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, r.Mode)
		require.False(t, r.BlindDrafts)
	}
}
