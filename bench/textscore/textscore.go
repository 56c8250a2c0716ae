// Package textscore compares an extracted text with a reference text as
// bags of words: what a search over the text would find.
package textscore

import (
	"strings"
	"unicode"
)

// Words counts a text's lowercased words (runs of letters and digits).
func Words(s string) map[string]int {
	m := map[string]int{}
	for _, w := range strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		m[w]++
	}
	return m
}

// F1 is the word-level precision, recall and F1 of got against ref (all
// zero when either has no word).
func F1(got, ref string) (p, r, f float64) {
	g, w := Words(got), Words(ref)
	var inter, ng, nw int
	for k, v := range g {
		ng += v
		inter += min(v, w[k])
	}
	for _, v := range w {
		nw += v
	}
	if ng == 0 || nw == 0 {
		return 0, 0, 0
	}
	p, r = float64(inter)/float64(ng), float64(inter)/float64(nw)
	if p+r > 0 {
		f = 2 * p * r / (p + r)
	}
	return p, r, f
}
