package session

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// FuzzParseRequests: whatever bytes an app (GenerateRequest) or a peer
// device (Begin) sends, parsing ends in a request within the limits or in
// an InvalidArgument, never a panic; and a request the device accepts, the
// cloud accepts as the device forwards it, with the same meaning.
func FuzzParseRequests(f *testing.F) {
	lim := Limits{MaxTokens: 64, MaxPassages: 4, MaxPrompt: 200}
	def := Defaults{MaxTokens: 16, PassagesDevice: 2, PassagesCloud: 2, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
	for _, g := range []*dragonv1.GenerateRequest{
		{Prompt: "q", System: "s", SwitchEvery: 3, BlindDrafts: true, Strategy: dragonv1.Strategy_STRATEGY_CLOUD},
		{Prompt: "q", Mode: dragonv1.Mode_MODE_TOKEN_WISE_SYNC, CodecTopP: 0.9, Sampling: &dragonv1.SamplingParams{MaxTokens: 40, Seed: 9, Temperature: 0.7, TopK: 40, TopP: 0.95, Stop: []string{"\n"}}, ConfidenceTemperature: 0.5},
		{Prompt: "q", MaxHedges: 2, HedgeDepth: 80, Aggregator: dragonv1.Side_SIDE_CLOUD, PassagesDevice: 4, PassagesCloud: 1},
		{Prompt: "q", History: []*dragonv1.ChatTurn{{Role: dragonv1.ChatRole_CHAT_ROLE_USER, Content: "a"}, {Role: dragonv1.ChatRole_CHAT_ROLE_ASSISTANT}}},
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
	require.Positive(t, r.MaxTokens)
	require.LessOrEqual(t, r.MaxTokens, lim.MaxTokens)
	for _, s := range r.Stop {
		require.NotEmpty(t, s)
	}
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
