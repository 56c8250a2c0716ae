package retrievalbench

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/engine/fake"
	"github.com/dragon-rag/dragon/retrieval"
)

func TestCleanSubject(t *testing.T) {
	for in, want := range map[string]string{
		"Re: [ILUG] slashdot EW Dijkstra humor": "slashdot EW Dijkstra humor",
		"RE: Fwd: Re: lunch plans":              "lunch plans",
		"  [SAdev] [spam] new rules ":           "new rules",
		"Quarterly report":                      "Quarterly report",
		"[unclosed tag":                         "[unclosed tag",
	} {
		assert.Equal(t, want, cleanSubject(in), in)
	}
}

// TestFollowUps: a follow-up alone names nothing of its mail; with the
// conversation it finds it as the first turn does.
func TestFollowUps(t *testing.T) {
	ix, _, err := retrieval.Build(t.Context(), filepath.Join(t.TempDir(), "ix"), retrieval.Options{Tokenizer: fake.New(fake.Config{Vocab: 300})})
	require.NoError(t, err)
	defer ix.Close()
	topics := []string{"glacier hiking boots", "sourdough starter feeding", "violin bow rehair", "kayak rudder repair"}
	for i, topic := range topics {
		mail := fmt.Sprintf("From: a@b\r\nSubject: Re: [list] %s\r\n\r\nNotes on %s from the weekend.\r\n", topic, topic)
		_, err := ix.Put(t.Context(), fmt.Sprintf("m%d.eml", i), []byte(mail), nil)
		require.NoError(t, err)
	}
	convs := MakeConversations(ix.Passages(), 10, 1)
	require.Len(t, convs, len(topics))
	assert.Regexp(t, `^What did the mail about [a-z ]+ say\?$`, convs[0].First, "no Re: or [list] tag")
	r, err := FollowUps(t.Context(), ix, retrieval.ModeBM25, convs, 1)
	require.NoError(t, err)
	assert.Equal(t, 1.0, r.First)
	assert.Equal(t, 0.0, r.LastMessage)
	assert.Equal(t, 1.0, r.Conversation)
	assert.Less(t, r.Switch, r.First, "a new subject retrieved with the old one's words too loses some of its mails")
}
