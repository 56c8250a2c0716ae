package session

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

func TestParseFilter(t *testing.T) {
	jan, jun := time.Date(2002, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2002, 6, 1, 0, 0, 0, 0, time.UTC)
	f, err := ParseFilter(&dragonv1.RetrievalFilter{SourcePrefix: "mail/", From: "ann", After: timestamppb.New(jan), Before: timestamppb.New(jun)}, "filter")
	require.NoError(t, err)
	assert.Equal(t, "mail/", f.SourcePrefix)
	assert.Equal(t, "ann", f.From)
	assert.True(t, f.After.Equal(jan))
	assert.True(t, f.Before.Equal(jun))
	f, err = ParseFilter(nil, "filter")
	require.NoError(t, err)
	assert.True(t, f.IsZero())

	for name, bad := range map[string]*dragonv1.RetrievalFilter{
		"before not after after": {After: timestamppb.New(jun), Before: timestamppb.New(jan)},
		"timestamp out of range": {After: &timestamppb.Timestamp{Seconds: -1 << 62}},
		"long string":            {From: strings.Repeat("x", MaxFilterBytes+1)},
	} {
		_, err := ParseFilter(bad, "cloud_filter")
		assert.Equal(t, codes.InvalidArgument, status.Code(err), name)
		assert.Contains(t, status.Convert(err).Message(), "cloud_filter", name)
	}
}

// TestBeginCarriesOnlyTheCloudFilter: the device's own filter never goes
// into the Begin (the leak control puts it there, and this test sees it).
func TestBeginCarriesOnlyTheCloudFilter(t *testing.T) {
	g := &dragonv1.GenerateRequest{
		Prompt: "q", Filter: &dragonv1.RetrievalFilter{From: "private person"},
		CloudFilter: &dragonv1.RetrievalFilter{SourcePrefix: "/public/"},
	}
	r, err := ParseGenerate(g, Limits{MaxTokens: 16, MaxPassages: 4, MaxPrompt: 1 << 10}, Defaults{Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION})
	require.NoError(t, err)
	assert.Equal(t, "private person", r.Filter.From)
	for _, leak := range []bool{false, true} {
		leakSources = leak
		b := r.Begin(1)
		leakSources = false
		if leak {
			assert.Equal(t, "private person", b.GetFilter().GetFrom(), "the control sends the device's filter")
			continue
		}
		assert.Equal(t, "/public/", b.GetFilter().GetSourcePrefix())
		assert.Empty(t, b.GetFilter().GetFrom())
		c, err := ParseBegin(b, Limits{MaxTokens: 16, MaxPassages: 4, MaxPrompt: 1 << 10}, Defaults{})
		require.NoError(t, err)
		assert.Equal(t, "/public/", c.Filter.SourcePrefix, "the cloud retrieves under the cloud filter")
	}
}

func TestRetrievalQueryFollowsTheConversation(t *testing.T) {
	r := Request{Query: "and what did he say about the price?"}
	assert.Equal(t, r.Query, RetrievalQuery(r), "no conversation: the message alone")
	r.History = []engine.Message{
		{Role: engine.RoleUser, Content: "hello"},
		{Role: engine.RoleAssistant, Content: "Hi! How can I help?"},
		{Role: engine.RoleUser, Content: "What did Dave write about the Razor release?"},
		{Role: engine.RoleAssistant, Content: "He announced version 2.14."},
	}
	assert.Equal(t, "hello\nWhat did Dave write about the Razor release?\nand what did he say about the price?", RetrievalQuery(r),
		"the user's last turns, not the answers")
	r.History = append(r.History, engine.Message{Role: engine.RoleUser, Content: "thanks"}, engine.Message{Role: engine.RoleAssistant, Content: "ok"})
	assert.Equal(t, "What did Dave write about the Razor release?\nthanks\nand what did he say about the price?", RetrievalQuery(r))
}
