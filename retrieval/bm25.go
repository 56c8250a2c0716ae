package retrieval

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/blevesearch/bleve/v2"
	"github.com/blevesearch/bleve/v2/analysis/lang/en"
	"github.com/blevesearch/bleve/v2/mapping"
	"github.com/blevesearch/bleve/v2/search"
	index "github.com/blevesearch/bleve_index_api"
)

// textField is the one indexed field of a bleve document.
const textField = "text"

// bleveBatch bounds one bleve batch, so indexing a large corpus does not
// build one huge in-memory segment.
const bleveBatch = 1000

// bm25Index is the lexical ranker: bleve with its BM25 scoring model.
// Passages are keyed by their decimal id; only the text is indexed and
// nothing is stored, since passages.jsonl holds the text.
type bm25Index struct {
	idx bleve.Index
}

func bleveMapping() mapping.IndexMapping {
	im := bleve.NewIndexMapping()
	im.ScoringModel = index.BM25Scoring
	im.DefaultAnalyzer = en.AnalyzerName
	im.StoreDynamic = false
	im.IndexDynamic = false
	im.DocValuesDynamic = false
	fm := bleve.NewTextFieldMapping()
	fm.Analyzer = en.AnalyzerName
	fm.Store = false
	fm.IncludeTermVectors = false
	fm.IncludeInAll = false
	fm.DocValues = false
	dm := bleve.NewDocumentStaticMapping()
	dm.AddFieldMappingsAt(textField, fm)
	im.DefaultMapping = dm
	return im
}

func createBM25(path string) (*bm25Index, error) {
	idx, err := bleve.New(path, bleveMapping())
	if err != nil {
		return nil, fmt.Errorf("create bleve index: %w", err)
	}
	return &bm25Index{idx: idx}, nil
}

func openBM25(path string, readOnly bool) (*bm25Index, error) {
	// bolt_timeout: a second writer gets an error instead of waiting
	// forever for the lock.
	idx, err := bleve.OpenUsing(path, map[string]any{"read_only": readOnly, "bolt_timeout": "2s"})
	if err != nil {
		return nil, err
	}
	return &bm25Index{idx: idx}, nil
}

type bleveDoc struct {
	Text string `json:"text"`
}

// apply deletes and adds passages.
func (b *bm25Index) apply(add []*Passage, del []uint64) error {
	batch := b.idx.NewBatch()
	flush := func() error {
		if batch.Size() == 0 {
			return nil
		}
		if err := b.idx.Batch(batch); err != nil {
			return fmt.Errorf("bleve batch: %w", err)
		}
		// A fresh batch, not Reset: scorch's Batch leaves a goroutine
		// reading the old one's operations after it returns (the race
		// detector caught Reset writing them).
		batch = b.idx.NewBatch()
		return nil
	}
	for _, id := range del {
		batch.Delete(docID(id))
		if batch.Size() >= bleveBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	for _, p := range add {
		if err := batch.Index(docID(p.ID), bleveDoc{Text: p.Text}); err != nil {
			return fmt.Errorf("bleve index passage %d: %w", p.ID, err)
		}
		if batch.Size() >= bleveBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

func docID(id uint64) string { return strconv.FormatUint(id, 10) }

type scored struct {
	id    uint64
	score float64
}

// corpusStats are the collection statistics BM25 needs: passages and
// analyzed terms in all of them.
type corpusStats struct {
	docs  int
	terms int64
}

// analyzedLength is the number of terms bleve indexes for text: the field
// length BM25 normalizes by.
func (b *bm25Index) analyzedLength(text string) int {
	return len(b.idx.Mapping().AnalyzerNamed(en.AnalyzerName).Analyze([]byte(text)))
}

// search returns up to n passages by BM25 score, best first, and the score
// a passage would need to match every query term at saturation.
//
// bleve 2.6.0 takes BM25's average field length to be the size of the
// field's term dictionary divided by the document count, about 1 for a
// corpus of short passages; every passage then looks dozens of times
// longer than average and short ones (a document's last passage, a
// one-line mail) win on length alone. Passing the true totals through
// search.BM25StatsKey, the hook bleve uses to share statistics across
// index aliases, restores the textbook average.
func (b *bm25Index) search(ctx context.Context, query string, n int, st corpusStats) ([]scored, float64, error) {
	if st.docs > 0 && st.terms > 0 {
		ctx = context.WithValue(ctx, search.BM25StatsKey, &search.BM25Stats{
			DocCount:         float64(st.docs),
			FieldCardinality: map[string]int{textField: int(st.terms)},
		})
	}
	q := bleve.NewMatchQuery(query)
	q.SetField(textField)
	q.Analyzer = en.AnalyzerName
	req := bleve.NewSearchRequestOptions(q, n, 0, false)
	res, err := b.idx.SearchInContext(ctx, req)
	if err != nil {
		return nil, 0, fmt.Errorf("bleve search: %w", err)
	}
	out := make([]scored, 0, len(res.Hits))
	for _, h := range res.Hits {
		id, err := strconv.ParseUint(h.ID, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("bleve hit with bad id %q: %w", h.ID, err)
		}
		out = append(out, scored{id, h.Score})
	}
	upper, err := b.upperBound(ctx, query, st.docs)
	if err != nil {
		return nil, 0, err
	}
	return out, upper, nil
}

// upperBound mirrors how bleve scores a match query under BM25: a
// disjunction of one term query per analyzed token, each worth
// idf·sat(tf)·(idf·queryNorm) with queryNorm = 1/sqrt(Σ idf²), times the
// coordination factor matched/total. As tf grows sat(tf) tends to k1, so
// no passage scores above k1·sqrt(Σ idf²). Dividing by it makes scores of
// different queries and of different corpora comparable: it is the share
// of the query's idf mass a passage matches.
func (b *bm25Index) upperBound(ctx context.Context, query string, docs int) (float64, error) {
	an := b.idx.Mapping().AnalyzerNamed(en.AnalyzerName)
	if an == nil {
		return 0, errors.New("bleve analyzer en missing")
	}
	tokens := an.Analyze([]byte(query))
	if len(tokens) == 0 {
		return 0, nil
	}
	ii, err := b.idx.Advanced()
	if err != nil {
		return 0, fmt.Errorf("bleve reader: %w", err)
	}
	r, err := ii.Reader()
	if err != nil {
		return 0, fmt.Errorf("bleve reader: %w", err)
	}
	defer r.Close()
	total := uint64(docs)
	if docs == 0 {
		if total, err = r.DocCount(); err != nil {
			return 0, fmt.Errorf("bleve doc count: %w", err)
		}
	}
	var sumSq float64
	for _, t := range tokens {
		tfr, err := r.TermFieldReader(ctx, t.Term, textField, false, false, false)
		if err != nil {
			return 0, fmt.Errorf("bleve term %q: %w", t.Term, err)
		}
		df := float64(tfr.Count())
		tfr.Close()
		idf := math.Log(1 + (float64(total)-df+0.5)/(df+0.5))
		sumSq += idf * idf
	}
	return search.BM25_k1 * math.Sqrt(sumSq), nil
}

// docFreqs counts the passages holding each analyzed term.
func (b *bm25Index) docFreqs(ctx context.Context, terms []string) (map[string]int, error) {
	ii, err := b.idx.Advanced()
	if err != nil {
		return nil, fmt.Errorf("bleve reader: %w", err)
	}
	r, err := ii.Reader()
	if err != nil {
		return nil, fmt.Errorf("bleve reader: %w", err)
	}
	defer r.Close()
	df := make(map[string]int, len(terms))
	for _, t := range terms {
		if _, done := df[t]; done {
			continue
		}
		tfr, err := r.TermFieldReader(ctx, []byte(t), textField, false, false, false)
		if err != nil {
			return nil, fmt.Errorf("bleve term %q: %w", t, err)
		}
		df[t] = int(tfr.Count())
		tfr.Close()
	}
	return df, nil
}

func (b *bm25Index) count() (uint64, error) { return b.idx.DocCount() }

func (b *bm25Index) close() error { return b.idx.Close() }
