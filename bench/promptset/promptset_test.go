package promptset

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/decoder"
)

func writeCorpus(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, c := range []string{"sotu", "mail"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, c), 0o755))
		for i := range 6 {
			body := strings.Repeat("Word number "+c+" goes here. ", 60)
			if c == "mail" {
				body = "Subject: hi\nFrom: a@b\n\n" + body
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, c, string(rune('a'+i))+".txt"), []byte(body), 0o644))
		}
	}
	return dir
}

func TestBuiltInIsDeterministic(t *testing.T) {
	dir := writeCorpus(t)
	a, err := BuiltIn(dir, 6, 4)
	require.NoError(t, err)
	b, err := BuiltIn(dir, 6, 4)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	require.Len(t, a, 6)
	for i, p := range a {
		require.Len(t, p.Passages, 4)
		assert.NotEmpty(t, p.Query)
		assert.Greater(t, p.Passages[0].Score, p.Passages[3].Score, "first passage scores highest")
		assert.NotContains(t, p.Passages[0].Text, "Subject:", "mail headers are dropped")
		assert.Equal(t, []string{"sotu", "mail"}[i%2], p.Corpus)
	}
	_, err = BuiltIn(t.TempDir(), 2, 1)
	require.ErrorContains(t, err, "make corpus")
}

func TestLoadJSONL(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	require.NoError(t, os.WriteFile(good, []byte(`{"prompt": "q1", "passages": ["a", "b"], "scores": [1, 2]}

{"prompt": "q2", "search": "taxes"}
`), 0o644))
	ps, err := LoadJSONL(good)
	require.NoError(t, err)
	require.Len(t, ps, 2)
	assert.Equal(t, 2.0, ps[0].Passages[1].Score)
	assert.Equal(t, "taxes", ps[1].Search)

	for name, body := range map[string]string{
		"empty prompt":   `{"passages": ["a"]}`,
		"score mismatch": `{"prompt": "q", "passages": ["a"], "scores": [1, 2]}`,
		"not json":       `prompt: q`,
		"no prompts":     "\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "_"))
			require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
			_, err := LoadJSONL(p)
			require.Error(t, err)
		})
	}
	_, err = LoadJSONL(filepath.Join(dir, "missing"))
	require.Error(t, err)
}

func TestHeldOutAvoidsBuiltIn(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []string{"sotu", "mail"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, c), 0o755))
		for i := range 120 {
			var b strings.Builder
			for w := range 90 {
				fmt.Fprintf(&b, "%s%d-%d ", c, i, w)
				if w%10 == 9 {
					b.WriteString("end. ")
				}
			}
			require.NoError(t, os.WriteFile(filepath.Join(dir, c, fmt.Sprintf("%03d.txt", i)), []byte(b.String()), 0o644))
		}
	}
	held, err := HeldOut(dir, 12, 4)
	require.NoError(t, err)
	again, err := HeldOut(dir, 12, 4)
	require.NoError(t, err)
	require.Equal(t, held, again, "deterministic")
	require.Len(t, held, 12)
	docOf := func(text string) string { return strings.SplitN(strings.Fields(text)[0], "-", 2)[0] }
	used := map[string]bool{}
	for _, size := range [][2]int{{20, 1}, {20, 4}, {4, 1}, {4, 4}} {
		ps, err := BuiltIn(dir, size[0], size[1])
		require.NoError(t, err)
		for _, p := range ps {
			used[p.Query] = true
			for _, x := range p.Passages {
				used[docOf(x.Text)] = true
			}
		}
	}
	for i, p := range held {
		require.False(t, used[p.Query], "question %q is a BuiltIn template", p.Query)
		require.Len(t, p.Passages, 4)
		require.Equal(t, []string{"sotu", "mail"}[i%2], p.Corpus)
		for _, x := range p.Passages {
			require.False(t, used[docOf(x.Text)], "document %s is one BuiltIn reads", docOf(x.Text))
		}
	}
}

// TestWithFollowUps: every held-out question has a rephrasing, asked
// right after it over the same passages; other prompts are refused.
func TestWithFollowUps(t *testing.T) {
	for _, q := range heldOutTemplates {
		require.Contains(t, followUps, q)
		require.NotEqual(t, q, followUps[q])
	}
	held := []Prompt{{Query: heldOutTemplates[0], Corpus: "sotu", Passages: []decoder.Passage{{Text: "a", Score: 2}}},
		{Query: heldOutTemplates[1], Corpus: "mail", Passages: []decoder.Passage{{Text: "b", Score: 2}}}}
	ps, err := WithFollowUps(held)
	require.NoError(t, err)
	require.Len(t, ps, 4)
	for i, p := range held {
		assert.Equal(t, p, ps[2*i])
		assert.Equal(t, followUps[p.Query], ps[2*i+1].Query)
		assert.Equal(t, p.Passages, ps[2*i+1].Passages)
		assert.Equal(t, p.Corpus, ps[2*i+1].Corpus)
	}
	_, err = WithFollowUps([]Prompt{{Query: "Who wrote it?"}})
	assert.ErrorContains(t, err, `no follow-up for "Who wrote it?"`)
}

// Windows takes the next long-enough document when the evenly spaced one
// is too short, and never the same document twice.
func TestWindowsSkipShortDocuments(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("word ", 40)
	for i, text := range []string{"short", "short", long, "short", long, "short"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d.txt", i)), []byte(text), 0o644))
	}
	texts, sources, err := Windows(dir, 3, 8)
	require.NoError(t, err)
	assert.Equal(t, []string{"d2.txt", "d4.txt"}, sources)
	for _, tx := range texts {
		assert.Len(t, strings.Fields(tx), 8)
	}
}
