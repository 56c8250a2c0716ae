// Package sources is what an answer rests on: the passages it was decoded
// over, each with its weight in the mixture before any token and its share
// of the answer after it. The share is the mixture's posterior given the
// answer (DRAGON §2.2's output aggregation, read backwards),
//
//	p(d | x) ∝ η_side·ω(d)·Π_t p(x_t | d, x_<t),
//
// with η_side·ω(d) = e^R(d) / Σ_d' e^R(d') over both sides' passages. Each
// side knows the product for its own passages (decoder.Evidence), so the
// device combines its own with the cloud's sums without any of its own
// passages crossing. The package is pure: numbers and strings in, numbers
// and strings out.
package sources

import (
	"fmt"
	"hash/fnv"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxExcerpt is the most characters of a passage's text an entry shows.
const MaxExcerpt = 300

// Shares returns each passage's mixture weight, softmax(scores), and its
// share of the answer, softmax(scores + logLik): scores are the passages'
// relevance R(d) and logLik their log-likelihoods of the answer. A
// logLik of nil means nothing is known of the answer: the shares are the
// weights. Passages of -Inf relevance get weight and share 0; no passage
// at all, or none of finite relevance, gives nil.
func Shares(scores, logLik []float64) (weights, shares []float64) {
	if len(scores) == 0 || (logLik != nil && len(logLik) != len(scores)) {
		return nil, nil
	}
	weights = softmax(scores)
	if weights == nil {
		return nil, nil
	}
	if logLik == nil {
		return weights, append([]float64(nil), weights...)
	}
	post := make([]float64, len(scores))
	for i := range scores {
		post[i] = scores[i] + logLik[i]
	}
	if shares = softmax(post); shares == nil {
		// Every passage finds the answer impossible (no finite
		// log-likelihood): nothing tells them apart beyond the prior.
		shares = append([]float64(nil), weights...)
	}
	return weights, shares
}

// softmax of v in float64, nil when no entry is finite.
func softmax(v []float64) []float64 {
	m := math.Inf(-1)
	for _, x := range v {
		if !math.IsNaN(x) {
			m = max(m, x)
		}
	}
	if math.IsInf(m, 0) {
		return nil
	}
	out := make([]float64, len(v))
	var sum float64
	for i, x := range v {
		if !math.IsNaN(x) {
			out[i] = math.Exp(x - m)
			sum += out[i]
		}
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// Excerpt is the start of text as an entry shows it: runs of white space
// folded to one space, the punctuation a passage cut mid-sentence starts
// with dropped, and cut at a word boundary to at most limit characters,
// "…" included, when it is longer.
func Excerpt(text string, limit int) string {
	folded := strings.Join(strings.FieldsFunc(text, unicode.IsSpace), " ")
	folded = strings.TrimLeft(folded, ".,;:!?) ")
	if utf8.RuneCountInString(folded) <= limit || limit <= 0 {
		if limit <= 0 {
			return ""
		}
		return folded
	}
	runes := []rune(folded)[:limit-1]
	cut := string(runes)
	if i := strings.LastIndexByte(cut, ' '); i > len(cut)/2 {
		cut = cut[:i]
	}
	return strings.TrimRight(cut, " ,;:.-") + "…"
}

// Title names a passage's document for a person: the mail's subject or the
// document's title where its metadata has one, else the file's name (with
// the message's number for a message of an mbox).
func Title(source string, meta map[string]string) string {
	for _, k := range []string{"subject", "title"} {
		if t := strings.TrimSpace(meta[k]); t != "" {
			return t
		}
	}
	base, n, ok := strings.Cut(source, "#")
	name := filepath.Base(base)
	if name == "." || name == "/" {
		name = source
	}
	if ok {
		if _, err := strconv.Atoi(n); err == nil {
			return name + ", message " + n
		}
	}
	return name
}

// DocumentID is a stable id of the document a source names: the same
// source always gets the same id, on any machine.
func DocumentID(source string) string {
	h := fnv.New64a()
	h.Write([]byte(source))
	return fmt.Sprintf("%016x", h.Sum64())
}
