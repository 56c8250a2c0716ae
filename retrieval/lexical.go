package retrieval

import (
	"math"
	"sync"

	"github.com/blevesearch/bleve/v2/analysis"
	"github.com/blevesearch/bleve/v2/analysis/lang/en"
	"github.com/blevesearch/bleve/v2/search"
)

var (
	analyzerOnce sync.Once
	analyzer     analysis.Analyzer
)

// Terms analyzes text as the BM25 index does (bleve's English analyzer:
// Unicode word segmentation, lower case, possessives, stop words, Porter
// stemming) and returns its terms in order, repeats kept. Every backend
// indexes these terms, so BM25 sees the same passages everywhere.
func Terms(text string) []string {
	analyzerOnce.Do(func() { analyzer = bleveMapping().AnalyzerNamed(en.AnalyzerName) })
	toks := analyzer.Analyze([]byte(text))
	out := make([]string, len(toks))
	for i, t := range toks {
		out[i] = string(t.Term)
	}
	return out
}

// LexicalScorer scores passages for one query exactly as our bleve index
// does (a match query: a disjunction of one term query per query term,
// BM25 with bleve's constants), from the passage's analyzed terms and
// corpus statistics. A backend that can only return candidates (Weaviate's
// own BM25 weighs terms differently and lacks the coordination factor) is
// ranked with it, so every backend orders passages the same way and R
// stays on one scale.
type LexicalScorer struct {
	query []string
	idf   map[string]float64
	qnorm float64
	avgdl float64
	upper float64
}

// NewLexicalScorer prepares scoring of query terms (repeats kept, as
// Terms gives them) over a corpus of docs passages holding terms analyzed
// terms in all, where df[t] passages hold term t.
func NewLexicalScorer(query []string, df map[string]int, docs int, terms int64) LexicalScorer {
	s := LexicalScorer{query: query, idf: make(map[string]float64, len(query))}
	if docs <= 0 || len(query) == 0 {
		return s
	}
	var sumSq float64
	for _, t := range query {
		n := float64(df[t])
		idf := math.Log(1 + (float64(docs)-n+0.5)/(n+0.5))
		s.idf[t] = idf
		sumSq += idf * idf
	}
	if sumSq > 0 {
		s.qnorm = 1 / math.Sqrt(sumSq)
	}
	// bleve rounds the average field length up.
	s.avgdl = math.Ceil(float64(terms) / float64(docs))
	s.upper = search.BM25_k1 * math.Sqrt(sumSq)
	return s
}

// Upper is the score of a passage matching every query term at
// saturation: BM25 scores divided by it are shares of the query's idf
// mass (bm25R).
func (s LexicalScorer) Upper() float64 { return s.upper }

// Score is the passage's BM25 score, 0 when it holds no query term.
func (s LexicalScorer) Score(passage []string) float64 {
	if len(s.query) == 0 || s.avgdl == 0 {
		return 0
	}
	freq := make(map[string]int, len(s.query))
	for _, t := range s.query {
		freq[t] = 0
	}
	for _, t := range passage {
		if _, ok := freq[t]; ok {
			freq[t]++
		}
	}
	// The index keeps 1/sqrt(length) as a float32 and scores with the
	// length read back from it.
	norm := float64(float32(1 / math.Sqrt(float64(len(passage)))))
	length := 1 / (norm * norm)
	k1, b := search.BM25_k1, search.BM25_b
	var sum float64
	matched := 0
	for _, t := range s.query {
		f := freq[t]
		if f == 0 {
			continue
		}
		matched++
		tf := math.Sqrt(float64(f))
		idf := s.idf[t]
		sum += idf * (tf * k1) / (tf + k1*(1-b+b*length/s.avgdl)) * (idf * s.qnorm)
	}
	return sum * float64(matched) / float64(len(s.query))
}
