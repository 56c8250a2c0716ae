package retrievalbench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/session"
)

// FollowUpTurns are the second turns of the conversations FollowUps makes:
// questions that name nothing of what the first turn was about, as people
// ask them.
var FollowUpTurns = []string{
	"Who sent it?",
	"When was that sent?",
	"What else did it say?",
	"Can you tell me more about that?",
}

// Conversation is a two-turn conversation about one mail.
type Conversation struct {
	Source   string `json:"source"` // the mail it is about
	First    string `json:"first"`
	FollowUp string `json:"follow_up"`
}

// MakeConversations draws n mails with a subject of at least three words
// from the passages (seeded, so the set is the same each run) and makes a
// conversation about each: "What did the mail about <subject> say?", then
// one of FollowUpTurns in turn.
func MakeConversations(passages []retrieval.Passage, n int, seed uint64) []Conversation {
	seen := map[string]bool{}
	var mails []retrieval.Passage
	for _, p := range passages {
		subj := cleanSubject(p.Meta["subject"])
		if subj == "" || seen[p.Source] || len(strings.Fields(subj)) < 3 {
			continue
		}
		seen[p.Source] = true
		mails = append(mails, p)
	}
	slices.SortFunc(mails, func(a, b retrieval.Passage) int { return strings.Compare(a.Source, b.Source) })
	rand.New(rand.NewPCG(seed, 0)).Shuffle(len(mails), func(i, j int) { mails[i], mails[j] = mails[j], mails[i] })
	out := make([]Conversation, 0, min(n, len(mails)))
	for i, m := range mails[:min(n, len(mails))] {
		out = append(out, Conversation{
			Source:   m.Source,
			First:    fmt.Sprintf("What did the mail about %s say?", cleanSubject(m.Meta["subject"])),
			FollowUp: FollowUpTurns[i%len(FollowUpTurns)],
		})
	}
	return out
}

// cleanSubject is a subject as a person would say it: without the "Re:"
// and "Fwd:" of replies and the "[list]" tags of mailing lists.
func cleanSubject(s string) string {
	s = strings.TrimSpace(s)
	for {
		t := s
		for _, p := range []string{"re:", "fw:", "fwd:", "aw:"} {
			if len(t) >= len(p) && strings.EqualFold(t[:len(p)], p) {
				t = strings.TrimSpace(t[len(p):])
			}
		}
		if strings.HasPrefix(t, "[") {
			if i := strings.Index(t, "]"); i > 0 {
				t = strings.TrimSpace(t[i+1:])
			}
		}
		if t == s {
			return s
		}
		s = t
	}
}

// FollowUpResult is how often the conversation's mail is retrieved.
type FollowUpResult struct {
	Conversations int `json:"conversations"`
	K             int `json:"k"`
	// First: at the first turn (the ceiling of the others).
	First float64 `json:"first_turn_recall"`
	// LastMessage: at the follow-up, retrieving with its words alone.
	LastMessage float64 `json:"follow_up_recall_last_message"`
	// Conversation: at the follow-up, with the conversation's retrieval
	// query (session.RetrievalQuery), as the daemons retrieve.
	Conversation float64 `json:"follow_up_recall_conversation"`
	// Switch: when the second turn is about another mail instead (the
	// next conversation's first question), how often that mail is found
	// with the conversation's retrieval query; its ceiling is First.
	Switch float64 `json:"new_subject_recall_conversation"`
}

// FollowUps retrieves k passages for each conversation's turns and counts
// how often its mail is among them.
func FollowUps(ctx context.Context, s retrieval.Searcher, mode retrieval.Mode, convs []Conversation, k int) (FollowUpResult, error) {
	r := FollowUpResult{Conversations: len(convs), K: k}
	if len(convs) == 0 {
		return r, fmt.Errorf("no conversations: the index holds no mail with a subject of three words or more")
	}
	found := func(q, source string) (bool, error) {
		hits, err := s.Search(ctx, q, k, mode)
		if err != nil {
			return false, err
		}
		for _, h := range hits {
			if h.Passage.Source == source {
				return true, nil
			}
		}
		return false, nil
	}
	var first, last, conv, switched int
	for i, c := range convs {
		after := func(q string) string {
			return session.RetrievalQuery(session.Request{Query: q, History: []engine.Message{
				{Role: engine.RoleUser, Content: c.First},
				{Role: engine.RoleAssistant, Content: "(the answer)"},
			}})
		}
		next := convs[(i+1)%len(convs)]
		for _, t := range []struct {
			query, source string
			n             *int
		}{
			{c.First, c.Source, &first},
			{c.FollowUp, c.Source, &last},
			{after(c.FollowUp), c.Source, &conv},
			{after(next.First), next.Source, &switched},
		} {
			ok, err := found(t.query, t.source)
			if err != nil {
				return r, err
			}
			if ok {
				*t.n++
			}
		}
	}
	total := float64(len(convs))
	r.First, r.LastMessage, r.Conversation = float64(first)/total, float64(last)/total, float64(conv)/total
	r.Switch = float64(switched) / total
	return r, nil
}
