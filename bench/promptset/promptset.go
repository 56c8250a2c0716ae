// Package promptset is the fixed set of RAG prompts the benchmarks and the
// real-model tests run: questions and summaries over passages taken, in a
// deterministic way, from the two demo corpora (State of the Union
// addresses for the cloud, the SpamAssassin ham mailbox for the device), or
// a user's own set from a JSON-lines file.
package promptset

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dragon-rag/dragon/decoder"
)

// Prompt is one RAG request.
type Prompt struct {
	Query    string            `json:"prompt"`
	Passages []decoder.Passage `json:"-"`
	// Texts are passages given in a JSON-lines file (scores descending by
	// position when Scores is empty).
	Texts  []string  `json:"passages,omitempty"`
	Scores []float64 `json:"scores,omitempty"`
	// Search, when set, asks the caller to retrieve passages for this
	// query from an index instead.
	Search string `json:"search,omitempty"`
	Corpus string `json:"corpus,omitempty"`
}

var templates = []string{
	"Summarize the passage in one sentence.",
	"What is the main point of the passage?",
	"Quote the most important sentence of the passage.",
	"What does the passage say? Answer briefly.",
	"Repeat the first sentence of the passage.",
}

// BuiltIn returns n prompts, alternating between the two corpora under dir
// (dir/sotu and dir/mail, as `make corpus` lays them out), each with
// passages passages: the one the question is about, first and highest
// scored, then neighbours from other documents.
func BuiltIn(dir string, n, passages int) ([]Prompt, error) {
	sources := map[string][]string{}
	for _, c := range []string{"sotu", "mail"} {
		texts, err := corpusTexts(filepath.Join(dir, c), c, n+passages)
		if err != nil {
			return nil, fmt.Errorf("promptset: %w (run `make corpus`)", err)
		}
		sources[c] = texts
	}
	return assemble(sources, templates, n, passages, 7), nil
}

// corpusTexts takes k evenly spaced documents of a corpus folder and a
// passage of about 60 words from each.
func corpusTexts(dir, kind string, k int) ([]string, error) {
	names, err := corpusNames(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for i := 0; len(out) < k && i < 4*k; i++ {
		p, err := passageOf(names[builtInPick(i, k, len(names))], kind, 1)
		if err != nil {
			return nil, err
		}
		if p != "" {
			out = append(out, p)
		}
	}
	if len(out) < k {
		return nil, fmt.Errorf("only %d usable documents in %s", len(out), dir)
	}
	return out, nil
}

// builtInPick is the document BuiltIn's corpusTexts reads i-th when it
// wants k of n.
func builtInPick(i, k, n int) int { return (i*n/k + i/k) % n }

func corpusNames(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil {
		return nil, err
	}
	names = slices.DeleteFunc(names, func(s string) bool { return strings.HasPrefix(filepath.Base(s), ".") })
	if len(names) == 0 {
		return nil, fmt.Errorf("no documents in %s", dir)
	}
	slices.Sort(names)
	return names, nil
}

// passageOf is about 60 words of a document from a sentence near thirds/3
// of it ("" when the document is too short); mail headers are dropped.
func passageOf(name, kind string, thirds int) (string, error) {
	raw, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	text := string(raw)
	if kind == "mail" {
		if i := strings.Index(text, "\n\n"); i >= 0 {
			text = text[i+2:]
		}
	}
	return excerpt(text, 60, thirds), nil
}

// heldOutTemplates are the questions of HeldOut: none of them is a
// template of BuiltIn, and no benchmark or default was tuned on them.
var heldOutTemplates = []string{
	"In two sentences, what is this passage about?",
	"Which facts does the passage state? List them.",
	"Explain the passage to a friend who has not read it.",
	"Who or what is the passage about, and what happens?",
	"Copy the sentence of the passage that matters most, then say why.",
	"What does the writer want? Answer from the passage.",
}

// followUps rephrase each of heldOutTemplates, as an owner asks about the
// same passage again in other words.
var followUps = map[string]string{
	"In two sentences, what is this passage about?":                     "Summarize the passage again, in two sentences.",
	"Which facts does the passage state? List them.":                    "List the facts of the passage once more.",
	"Explain the passage to a friend who has not read it.":              "Explain the passage again, as simply as you can.",
	"Who or what is the passage about, and what happens?":               "Say again who or what the passage is about and what happens in it.",
	"Copy the sentence of the passage that matters most, then say why.": "Which sentence of the passage matters most? Copy it and say why.",
	"What does the writer want? Answer from the passage.":               "Again: what does the writer of the passage want?",
}

// WithFollowUps returns each of HeldOut's prompts followed by a related
// one: its question in other words, over the same passages (a user who
// asks about the same mail twice; drafting from earlier answers is
// measured on these).
func WithFollowUps(ps []Prompt) ([]Prompt, error) {
	out := make([]Prompt, 0, 2*len(ps))
	for _, p := range ps {
		q, ok := followUps[p.Query]
		if !ok {
			return nil, fmt.Errorf("promptset: no follow-up for %q (not a HeldOut prompt)", p.Query)
		}
		f := p
		f.Query = q
		out = append(out, p, f)
	}
	return out, nil
}

// builtInSizes are the BuiltIn sizes the project's benchmarks and tests
// use (documents wanted per corpus: prompts + passages): 20 prompts of 1
// and 4 passages, 4 prompts of 1 and 4.
var builtInSizes = []int{21, 24, 5, 8}

// HeldOut returns n prompts with passages passages each that no benchmark
// or test of the project has seen: other questions than BuiltIn's
// (heldOutTemplates), over documents of the same two corpora that BuiltIn
// never reads at the sizes the project uses, each passage about 60 words
// from a sentence two thirds into its document (BuiltIn reads one third
// in). Otherwise laid out like BuiltIn: corpora alternate, the passage the
// question is about comes first and scores highest.
func HeldOut(dir string, n, passages int) ([]Prompt, error) {
	sources := map[string][]string{}
	for _, c := range []string{"sotu", "mail"} {
		names, err := corpusNames(filepath.Join(dir, c))
		if err != nil {
			return nil, fmt.Errorf("promptset: %w (run `make corpus`)", err)
		}
		seen := map[int]bool{}
		for _, k := range builtInSizes {
			for i := range 2 * k {
				seen[builtInPick(i, k, len(names))] = true
			}
		}
		var free []string
		for i, name := range names {
			if !seen[i] {
				free = append(free, name)
			}
		}
		want := n + passages
		var texts []string
		for i := 0; len(texts) < want && i < len(free); i++ {
			// Evenly spaced over the free documents, then the ones
			// between them.
			j := (i%want*len(free)/want + i/want) % len(free)
			p, err := passageOf(free[j], c, 2)
			if err != nil {
				return nil, fmt.Errorf("promptset: %w", err)
			}
			if p != "" {
				texts = append(texts, p)
			}
		}
		if len(texts) < want {
			return nil, fmt.Errorf("promptset: only %d usable held-out documents in %s", len(texts), filepath.Join(dir, c))
		}
		sources[c] = texts
	}
	return assemble(sources, heldOutTemplates, n, passages, 5), nil
}

// assemble makes n prompts alternating between the sotu and mail corpora,
// the i-th asking the i-th template (cyclically) over passages documents of
// its corpus taken stride apart, scored in decreasing order.
func assemble(sources map[string][]string, templates []string, n, passages, stride int) []Prompt {
	out := make([]Prompt, 0, n)
	for i := range n {
		c := "sotu"
		if i%2 == 1 {
			c = "mail"
		}
		texts := sources[c]
		p := Prompt{Query: templates[i%len(templates)], Corpus: c}
		for j := range passages {
			p.Passages = append(p.Passages, decoder.Passage{
				Text:   texts[(i/2+j*stride)%len(texts)],
				Score:  2 - 0.5*float64(j),
				Source: c,
			})
		}
		out = append(out, p)
	}
	return out
}

// excerpt is about words words starting at a sentence near thirds/3 of
// the text.
func excerpt(text string, words, thirds int) string {
	fields := strings.Fields(text)
	if len(fields) < words/2 {
		return ""
	}
	start := thirds * len(fields) / 3
	for i := start; i < min(start+40, len(fields)); i++ {
		if i > 0 && strings.HasSuffix(fields[i-1], ".") {
			start = i
			break
		}
	}
	end := min(len(fields), start+words)
	return strings.Join(fields[start:end], " ")
}

// LoadJSONL reads prompts, one JSON object per line: {"prompt": "...",
// "passages": ["...", ...], "scores": [...]} or {"prompt": "...",
// "search": "query for the index"}.
func LoadJSONL(path string) ([]Prompt, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("promptset: %w", err)
	}
	defer f.Close()
	var out []Prompt
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for line := 1; sc.Scan(); line++ {
		raw := strings.TrimSpace(sc.Text())
		if raw == "" {
			continue
		}
		var p Prompt
		if err := json.Unmarshal([]byte(raw), &p); err != nil {
			return nil, fmt.Errorf("promptset: %s:%d: %w", path, line, err)
		}
		if p.Query == "" {
			return nil, fmt.Errorf("promptset: %s:%d: empty \"prompt\"", path, line)
		}
		if len(p.Scores) > 0 && len(p.Scores) != len(p.Texts) {
			return nil, fmt.Errorf("promptset: %s:%d: %d scores for %d passages", path, line, len(p.Scores), len(p.Texts))
		}
		for i, t := range p.Texts {
			score := -0.5 * float64(i)
			if len(p.Scores) > 0 {
				score = p.Scores[i]
			}
			p.Passages = append(p.Passages, decoder.Passage{Text: t, Score: score})
		}
		out = append(out, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("promptset: %s: %w", path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("promptset: %s holds no prompts", path)
	}
	return out, nil
}

// Questions are retrieval questions over the two demo corpora: the State
// of the Union addresses and the mailbox.
var Questions = []string{
	"What did the president say about taxes and the federal budget?",
	"How should the country deal with foreign nations and treaties?",
	"What was said about the army, the navy and national defense?",
	"What are the plans for education and schools?",
	"What did the address say about the economy and jobs?",
	"How are Indian tribes on the frontier to be treated?",
	"What is proposed for roads, canals and railroads?",
	"What did the president say about slavery and the union?",
	"What is the problem with the mail client or the spam filter?",
	"Which Linux packages or RPMs were discussed?",
	"Who is having trouble installing software?",
	"What did the message say about the mailing list?",
	"What was said about Python scripts or Perl code?",
	"What is the news about the company or the product release?",
	"Who wrote about the server being down?",
	"What did people say about music and sound on Linux?",
}

// Windows are held-out spans of about words words from n evenly spaced
// documents of a corpus folder, for perplexity: the text and the name of
// the file it comes from.
func Windows(dir string, n, words int) (texts, sources []string, err error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(names) == 0 {
		return nil, nil, fmt.Errorf("promptset: no .txt documents in %s (run `make corpus`)", dir)
	}
	slices.Sort(names)
	used := map[int]bool{}
	for i := 0; i < n && i < len(names); i++ {
		// The i-th of n evenly spaced documents, or the next one long
		// enough (a corpus of short articles has few).
		for j := (2*i + 1) * len(names) / (2 * n); j < len(names); j++ {
			if used[j] {
				continue
			}
			raw, err := os.ReadFile(names[j])
			if err != nil {
				return nil, nil, fmt.Errorf("promptset: %w", err)
			}
			fields := strings.Fields(string(raw))
			if len(fields) < 3*words {
				continue
			}
			used[j] = true
			start := 2 * len(fields) / 3
			texts = append(texts, strings.Join(fields[start:start+words], " "))
			sources = append(sources, filepath.Base(names[j]))
			break
		}
	}
	return texts, sources, nil
}

// DemoQuestion needs both sides: a mail in the device's mailbox and a
// State of the Union address in the cloud's corpus answer it together.
const DemoQuestion = "What did my mail say about California electricity prices, and what did the president propose on energy?"
