// Package retrievalbench measures retrieval: answer recall on labelled
// open-domain questions (DPR's metric) for each ranker and embedder, and
// embedding throughput.
package retrievalbench

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// Question is a labelled question: any of Answers in a retrieved passage
// counts as a hit.
type Question struct {
	Text    string
	Answers []string
}

// LoadQuestions reads DPR's topic files as anserini ships them: one
// question per line, a tab, then the answers as a Python list literal
// (['a', "b's"]), CSV-quoted where it holds a double quote.
func LoadQuestions(path string) ([]Question, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("questions: %w (make wiki fetches DPR's)", err)
	}
	defer f.Close()
	var qs []Question
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text, list, ok := strings.Cut(strings.TrimRight(sc.Text(), "\r"), "\t")
		if !ok {
			return nil, fmt.Errorf("%s:%d: no tab between question and answers", path, line)
		}
		// Lines whose answers hold a double quote are CSV-quoted.
		if len(list) >= 2 && list[0] == '"' && list[len(list)-1] == '"' {
			list = strings.ReplaceAll(list[1:len(list)-1], `""`, `"`)
		}
		answers, err := parsePyList(list)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		if strings.TrimSpace(text) == "" || len(answers) == 0 {
			return nil, fmt.Errorf("%s:%d: empty question or no answers", path, line)
		}
		qs = append(qs, Question{Text: strings.TrimSpace(text), Answers: answers})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return qs, nil
}

// parsePyList parses a Python list of string literals as repr() prints
// it: single or double quotes, backslash escapes.
func parsePyList(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if len(s) < 2 || s[0] != '[' || s[len(s)-1] != ']' {
		return nil, fmt.Errorf("answers %q are not a list", s)
	}
	var out []string
	rs := []rune(s[1 : len(s)-1])
	for i := 0; i < len(rs); {
		switch c := rs[i]; {
		case c == ' ' || c == ',':
			i++
		case c == '\'' || c == '"':
			var b strings.Builder
			j := i + 1
			for ; j < len(rs) && rs[j] != c; j++ {
				if rs[j] == '\\' && j+1 < len(rs) {
					j++
				}
				b.WriteRune(rs[j])
			}
			if j == len(rs) {
				return nil, fmt.Errorf("unterminated string in %q", s)
			}
			out = append(out, b.String())
			i = j + 1
		default:
			return nil, fmt.Errorf("unexpected %q in %q", c, s)
		}
	}
	return out, nil
}

// Words is DPR's has-answer tokenization: lowercased, accents stripped,
// runs of letters and digits (punctuation dropped). Bytes that are not
// UTF-8 (a model's output cut inside a character) separate words as
// U+FFFD does; left in near the end of the text, one kept NFD from
// stripping the accent of the character after it ("\xf7é" stayed "é").
func Words(s string) []string {
	var out []string
	var b strings.Builder
	flush := func() {
		if b.Len() > 0 {
			out = append(out, b.String())
			b.Reset()
		}
	}
	for _, c := range norm.NFD.String(strings.ToValidUTF8(s, "\uFFFD")) {
		switch {
		case unicode.Is(unicode.Mn, c):
		case unicode.IsLetter(c) || unicode.IsDigit(c):
			b.WriteRune(unicode.ToLower(c))
		default:
			flush()
		}
	}
	flush()
	return out
}

// containsSeq reports whether the word sequence needle occurs in hay.
func containsSeq(hay, needle []string) bool {
	if len(needle) == 0 {
		return false
	}
	for i := 0; i+len(needle) <= len(hay); i++ {
		if slices.Equal(hay[i:i+len(needle)], needle) {
			return true
		}
	}
	return false
}

// HasAnswer reports whether any answer occurs, word for word, in text.
func HasAnswer(text string, answers []string) bool {
	words := Words(text)
	for _, a := range answers {
		if containsSeq(words, Words(a)) {
			return true
		}
	}
	return false
}

// AnswerIndex finds the passages holding a question's answer among many,
// through an inverted index of words.
type AnswerIndex struct {
	words    [][]string
	postings map[string][]int
}

// NewAnswerIndex indexes passages' words.
func NewAnswerIndex(passages []string) *AnswerIndex {
	ix := &AnswerIndex{words: make([][]string, len(passages)), postings: map[string][]int{}}
	for i, p := range passages {
		ix.words[i] = Words(p)
		seen := map[string]bool{}
		for _, w := range ix.words[i] {
			if !seen[w] {
				seen[w] = true
				ix.postings[w] = append(ix.postings[w], i)
			}
		}
	}
	return ix
}

// Holding returns the passages (indexes into those given) that contain
// any of answers, in order.
func (ix *AnswerIndex) Holding(answers []string) []int {
	hit := map[int]bool{}
	for _, a := range answers {
		aw := Words(a)
		if len(aw) == 0 {
			continue
		}
		rare := aw[0]
		for _, w := range aw[1:] {
			if len(ix.postings[w]) < len(ix.postings[rare]) {
				rare = w
			}
		}
		for _, p := range ix.postings[rare] {
			if !hit[p] && containsSeq(ix.words[p], aw) {
				hit[p] = true
			}
		}
	}
	out := make([]int, 0, len(hit))
	for p := range hit {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}
