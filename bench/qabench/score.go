// Package qabench measures open-domain question answering across the two
// sides: real Wikipedia split into a public (cloud) half and a private
// (device) half, DPR's labelled questions, each mode of generation, and
// the answers scored as a user sees them (exact match, token F1, answer
// contained).
package qabench

import (
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
)

// Normalize is SQuAD's answer normalisation, made Unicode-aware: lower
// case, compatibility forms folded and accents dropped (NFKD, combining
// marks removed: "km²" is "km2", "Röntgen" "rontgen"), punctuation and
// symbols removed, the articles a/an/the removed, whitespace collapsed.
// Lower case comes after the folding: some compatibility forms fold to
// capitals ("ℌ" and "𝐇" are "H"), so lowering first left them upper case
// and Normalize(Normalize(s)) != Normalize(s). Bytes that are not UTF-8
// (a model's output cut inside a character) become U+FFFD, a symbol, and
// go: left in near the end of the text, one kept NFKD from folding the
// character after it ("\xf7ϔ" stayed "ϔ").
func Normalize(s string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(norm.NFKD.String(strings.ToValidUTF8(s, "\uFFFD"))) {
		switch {
		case unicode.Is(unicode.Mn, c):
		case unicode.IsPunct(c) || unicode.IsSymbol(c):
			// SQuAD deletes punctuation rather than splitting on it:
			// "o'neill" is "oneill", "u.s." is "us".
		case unicode.IsSpace(c):
			b.WriteByte(' ')
		default:
			b.WriteRune(c)
		}
	}
	words := strings.Fields(b.String())
	kept := words[:0]
	for _, w := range words {
		if w != "a" && w != "an" && w != "the" {
			kept = append(kept, w)
		}
	}
	return strings.Join(kept, " ")
}

// ExactMatch is 1 when the normalised prediction equals any normalised
// gold answer.
func ExactMatch(pred string, golds []string) float64 {
	p := Normalize(pred)
	for _, g := range golds {
		if p == Normalize(g) {
			return 1
		}
	}
	return 0
}

// F1 is SQuAD's token F1 (bags of normalised words), the best over the
// gold answers.
func F1(pred string, golds []string) float64 {
	p := strings.Fields(Normalize(pred))
	best := 0.0
	for _, g := range golds {
		best = max(best, tokenF1(p, strings.Fields(Normalize(g))))
	}
	return best
}

func tokenF1(pred, gold []string) float64 {
	if len(pred) == 0 || len(gold) == 0 {
		// Both empty is a match (SQuAD); one empty is not.
		if len(pred) == len(gold) {
			return 1
		}
		return 0
	}
	count := map[string]int{}
	for _, w := range gold {
		count[w]++
	}
	common := 0
	for _, w := range pred {
		if count[w] > 0 {
			count[w]--
			common++
		}
	}
	if common == 0 {
		return 0
	}
	precision := float64(common) / float64(len(pred))
	recall := float64(common) / float64(len(gold))
	return 2 * precision * recall / (precision + recall)
}

// Contained is DPR's has-answer test on the answer: 1 when any gold
// answer occurs in it word for word (lower case, accents and punctuation
// dropped), so a full sentence holding the answer counts.
func Contained(pred string, golds []string) float64 {
	if retrievalbench.HasAnswer(pred, golds) {
		return 1
	}
	return 0
}

// Scores are one answer's three scores.
type Scores struct {
	EM        float64 `json:"em"`
	F1        float64 `json:"f1"`
	Contained float64 `json:"contained"`
}

// Score scores a prediction against the gold answers.
func Score(pred string, golds []string) Scores {
	return Scores{EM: ExactMatch(pred, golds), F1: F1(pred, golds), Contained: Contained(pred, golds)}
}
