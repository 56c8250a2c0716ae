package experiments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dragon-rag/dragon/bench/nodebench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/rerank"
	"github.com/dragon-rag/dragon/retrieval"
)

// QualityOptions size E4.
type QualityOptions struct {
	Model engine.Model
	// Corpus is a folder of .txt documents: windows are held out from it,
	// the rest is split between a device and a cloud index.
	Corpus   string
	Windows  int
	Words    int   // per window: the first half is the query and context, the second is scored
	Passages []int // per side; 0 is no retrieval
	// Methods are the methods measured (default qualityMethods); none is
	// always measured.
	Methods []string
	Threads int
	Log     func(format string, args ...any)
	// Reranker, when set, measures two more methods: dragon-rerank (each
	// side's RerankCandidates BM25 candidates re-ranked by the
	// cross-encoder, weighted by its logits) and dragon-dynamic (those
	// passages re-scored against the first half and the continuation so
	// far every RescoreEvery tokens, DRAGON §4.1).
	Reranker         *rerank.Reranker
	RerankCandidates int
	RescoreEvery     int
	// PosteriorEvery is the tokens between posterior weightings of
	// dragon-posterior (and, with a Reranker, dragon-rerank-posterior):
	// each passage's weight its posterior given the continuation so far
	// (0: 1, every token, the mixture of whole sequences).
	PosteriorEvery int
	// Split is how the two sides' passages are drawn: SplitFiles (the
	// default) or SplitRank.
	Split string
	// OwnArticle keeps the rest of each window's article in the corpus:
	// the text before the window and the text after it, as two documents,
	// so no passage holds the window's words. The paper's WikiText
	// articles are in the Wikipedia it retrieves from; without this only
	// other articles are.
	OwnArticle bool
}

// How E4 gives each side its passages.
const (
	// SplitFiles splits the corpus's documents between a device and a cloud
	// index, alternately by file name; each side retrieves from its own.
	SplitFiles = "files"
	// SplitRank is DRAGON §7.2's: one index over the corpus, and of the
	// top 2k passages the cloud gets the first k and the device the next k
	// ("insufficient but complementary" sides).
	SplitRank = "rank"
)

// The methods a Reranker adds.
const (
	methodRerank  = "dragon-rerank"
	methodDynamic = "dragon-dynamic"
	// The posterior weights of the first stage's scores (no Reranker
	// needed) and of the re-ranker's.
	methodPosterior       = "dragon-posterior"
	methodRerankPosterior = "dragon-rerank-posterior"
)

// E4's methods, as e4.csv names them.
var qualityMethods = []string{"none", "device-only", "cloud-only", "context", "dragon"}

// familyMethods are Figure 5's: no retrieval, the cloud's passages in
// context (CRCG), both sides' in context (DRCG), and DRAGON.
var familyMethods = []string{"none", "cloud-context", "context", "dragon"}

// Quality measures E4: the perplexity of the second half of held-out
// windows given the first, for each method and passages per side. The
// corpus minus the windows' documents is split between two BM25 indexes,
// alternately by file name; each side retrieves for the window's first
// half. dragon is output aggregation over both sides' passages weighted by
// softmax of their scores, which is DRAGON's mixture η_d·p_d + η_c·p_c
// when η is the softmax of the sides' log-sum-exp scores (as the
// aggregator computes it); context is all of them concatenated before the
// first half in one sequence.
func Quality(ctx context.Context, o QualityOptions) (map[string]map[string]float64, int, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if len(o.Methods) == 0 {
		o.Methods = qualityMethods[1:]
	}
	for _, m := range o.Methods {
		if !slices.Contains([]string{"device-only", "cloud-only", "context", "cloud-context", "dragon", methodRerank, methodDynamic, methodPosterior, methodRerankPosterior}, m) {
			return nil, 0, fmt.Errorf("experiments: E4 has no method %q", m)
		}
	}
	if (slices.Contains(o.Methods, methodRerank) || slices.Contains(o.Methods, methodDynamic) || slices.Contains(o.Methods, methodRerankPosterior)) && o.Reranker == nil {
		return nil, 0, errors.New("experiments: E4's re-ranked methods need a re-ranker")
	}
	if o.RescoreEvery <= 0 {
		o.RescoreEvery = 16
	}
	if o.PosteriorEvery <= 0 {
		o.PosteriorEvery = 1
	}
	switch o.Split {
	case "":
		o.Split = SplitFiles
	case SplitFiles, SplitRank:
	default:
		return nil, 0, fmt.Errorf("experiments: E4 split %q: %s or %s", o.Split, SplitFiles, SplitRank)
	}
	texts, sources, err := promptset.Windows(o.Corpus, o.Windows, o.Words)
	if err != nil {
		return nil, 0, err
	}
	names, err := filepath.Glob(filepath.Join(o.Corpus, "*.txt"))
	if err != nil {
		return nil, 0, err
	}
	slices.Sort(names)
	var rest []string
	for _, n := range names {
		if !slices.Contains(sources, filepath.Base(n)) {
			rest = append(rest, n)
		}
	}
	if o.OwnArticle {
		dir, err := os.MkdirTemp("", "dragon-e4-own")
		if err != nil {
			return nil, 0, err
		}
		defer os.RemoveAll(dir)
		parts, err := articleRests(o.Corpus, dir, texts, sources)
		if err != nil {
			return nil, 0, err
		}
		rest = append(rest, parts...)
	}
	// One index per side, or one for both under SplitRank.
	parts, sides := [][]string{rest}, []string{"shared"}
	if o.Split == SplitFiles {
		parts, sides = make([][]string, 2), []string{"device", "cloud"}
		for i, n := range rest {
			parts[i%2] = append(parts[i%2], n)
		}
	}
	ix := make([]*retrieval.Index, len(parts))
	for i, side := range sides {
		dir, err := os.MkdirTemp("", "dragon-e4-"+side)
		if err != nil {
			return nil, 0, err
		}
		defer os.RemoveAll(dir)
		x, _, err := retrieval.Build(ctx, filepath.Join(dir, "index"), retrieval.Options{Tokenizer: o.Model}, parts[i]...)
		if err != nil {
			return nil, 0, fmt.Errorf("experiments: %s index: %w", side, err)
		}
		defer x.Close()
		ix[i] = x
		o.Log("E4: %s index of %d documents", side, len(parts[i]))
	}
	most := slices.Max(o.Passages)
	// sidesOf are the device's and the cloud's k passages from what the
	// indexes returned for the window.
	sidesOf := func(hits [][]retrieval.Hit, k int) (device, cloud []retrieval.Hit) {
		if o.Split == SplitRank {
			all := hits[0]
			return all[min(k, len(all)):min(2*k, len(all))], all[:min(k, len(all))]
		}
		return hits[0][:min(k, len(hits[0]))], hits[1][:min(k, len(hits[1]))]
	}
	out, err := decoder.New(o.Model, decoder.Options{MaxPassages: max(2*most, 1), CtxPerSeq: 512, Threads: o.Threads})
	if err != nil {
		return nil, 0, err
	}
	defer out.Close()
	// Context aggregation holds every passage of both sides (at most 64
	// tokens each, and a blank line) before the window.
	cat, err := decoder.New(o.Model, decoder.Options{MaxPassages: 1, CtxPerSeq: max(2048, 2*most*72+4*o.Words+256), Threads: o.Threads})
	if err != nil {
		return nil, 0, err
	}
	defer cat.Close()

	nll := map[string]map[int]float64{}
	for _, m := range append([]string{"none"}, o.Methods...) {
		nll[m] = map[int]float64{}
	}
	measured := func(m string) bool { return slices.Contains(o.Methods, m) }
	// concatenated is the NLL of the window's second half after the
	// passages of hits and its first half, in one sequence.
	concatenated := func(hits []retrieval.Hit, first, second string) (float64, error) {
		x, _, err := nodebench.NLL(ctx, cat, []string{contextPrompt(hits, first)}, []float64{0}, second)
		return x, err
	}
	tokens, windows := 0, 0
	for w, text := range texts {
		half := nodebench.SplitHalf(text)
		if half[0] == "" || half[1] == "" {
			continue
		}
		hits, reranked := make([][]retrieval.Hit, len(ix)), make([][]retrieval.Hit, len(ix))
		for i := range ix {
			n, candidates := max(most, 1), o.RerankCandidates
			if o.Split == SplitRank { // the one index serves both sides' k
				n, candidates = 2*n, 2*candidates
			}
			if hits[i], err = ix[i].Search(ctx, half[0], n, retrieval.ModeBM25); err != nil {
				return nil, 0, err
			}
			if o.Reranker != nil {
				rs := &rerank.Searcher{Inner: ix[i], Reranker: o.Reranker, Candidates: candidates}
				if reranked[i], err = rs.Search(ctx, half[0], n, retrieval.ModeBM25); err != nil {
					return nil, 0, err
				}
			}
		}
		none, n, err := nodebench.NLL(ctx, out, []string{half[0]}, []float64{0}, half[1])
		if err != nil {
			return nil, 0, err
		}
		tokens += n
		windows++
		for _, k := range o.Passages {
			nll["none"][k] += none
			if k == 0 {
				for m := range nll {
					if m != "none" { // no passages: every method is the model alone
						nll[m][k] += none
					}
				}
				continue
			}
			d, c := sidesOf(hits, k)
			both := append(slices.Clone(d), c...)
			for _, run := range []struct {
				method string
				hits   []retrieval.Hit
			}{{"device-only", d}, {"cloud-only", c}, {"dragon", both}} {
				if !measured(run.method) {
					continue
				}
				prefixes, scores := nodebench.WithPassages(run.hits, half[0])
				x, _, err := nodebench.NLL(ctx, out, prefixes, scores, half[1])
				if err != nil {
					return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", run.method, k, err)
				}
				nll[run.method][k] += x
			}
			if measured(methodPosterior) {
				prefixes, scores := nodebench.WithPassages(both, half[0])
				x, _, err := nodebench.NLLPosterior(ctx, out, prefixes, scores, half[1], o.PosteriorEvery)
				if err != nil {
					return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", methodPosterior, k, err)
				}
				nll[methodPosterior][k] += x
			}
			if o.Reranker != nil && (measured(methodRerank) || measured(methodDynamic) || measured(methodRerankPosterior)) {
				rd, rc := sidesOf(reranked, k)
				rboth := append(slices.Clone(rd), rc...)
				prefixes, scores := nodebench.WithPassages(rboth, half[0])
				if measured(methodRerank) {
					x, _, err := nodebench.NLL(ctx, out, prefixes, scores, half[1])
					if err != nil {
						return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", methodRerank, k, err)
					}
					nll[methodRerank][k] += x
				}
				if measured(methodRerankPosterior) {
					x, _, err := nodebench.NLLPosterior(ctx, out, prefixes, scores, half[1], o.PosteriorEvery)
					if err != nil {
						return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", methodRerankPosterior, k, err)
					}
					nll[methodRerankPosterior][k] += x
				}
				if measured(methodDynamic) {
					texts := make([]string, len(rboth))
					for i, h := range rboth {
						texts[i] = h.Passage.Text
					}
					rescore := func(ctx context.Context, answer string) ([]float64, error) {
						return o.Reranker.Relevance(ctx, half[0]+" "+answer, texts)
					}
					x, _, err := nodebench.NLLDynamic(ctx, out, prefixes, scores, half[1], o.RescoreEvery, rescore)
					if err != nil {
						return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", methodDynamic, k, err)
					}
					nll[methodDynamic][k] += x
				}
			}
			for _, run := range []struct {
				method string
				hits   []retrieval.Hit
			}{{"context", both}, {"cloud-context", c}} {
				if !measured(run.method) {
					continue
				}
				x, err := concatenated(run.hits, half[0], half[1])
				if err != nil {
					return nil, 0, fmt.Errorf("experiments: E4 %s, %d passages: %w", run.method, k, err)
				}
				nll[run.method][k] += x
			}
		}
		o.Log("E4: window %d of %d", w+1, len(texts))
	}
	if tokens == 0 {
		return nil, 0, errors.New("experiments: E4 found no usable window")
	}
	ppl := map[string]map[string]float64{}
	for m, byK := range nll {
		ppl[m] = map[string]float64{}
		for k, v := range byK {
			ppl[m][strconv.Itoa(k)] = math.Exp(v / float64(tokens))
		}
	}
	return ppl, windows, nil
}

// contextPrompt is context aggregation's one sequence: the passages of
// hits, the least relevant first, so that the most relevant is next to
// the text, as in-context retrieval places its document (In-Context
// RALM), then the text.
func contextPrompt(hits []retrieval.Hit, text string) string {
	hits = slices.Clone(hits)
	slices.SortStableFunc(hits, func(a, b retrieval.Hit) int { return cmp.Compare(a.Score, b.Score) })
	var all strings.Builder
	for _, h := range hits {
		all.WriteString(h.Passage.Text + "\n\n")
	}
	return all.String() + text
}

// articleRests writes, for each window texts[i] of the document
// sources[i] in corpus, the document's words before the window and after
// it as two documents in dir (none where a side is empty), and returns
// their paths.
func articleRests(corpus, dir string, texts, sources []string) ([]string, error) {
	var paths []string
	for i, src := range sources {
		raw, err := os.ReadFile(filepath.Join(corpus, src))
		if err != nil {
			return nil, fmt.Errorf("experiments: E4 own article: %w", err)
		}
		fields, window := strings.Fields(string(raw)), strings.Fields(texts[i])
		at := -1
		for j := 0; j+len(window) <= len(fields); j++ {
			if slices.Equal(fields[j:j+len(window)], window) {
				at = j
				break
			}
		}
		if at < 0 {
			return nil, fmt.Errorf("experiments: E4 own article: window %d not found in %s", i, src)
		}
		base := strings.TrimSuffix(src, ".txt")
		for _, part := range []struct {
			name  string
			words []string
		}{{base + ".before.txt", fields[:at]}, {base + ".after.txt", fields[at+len(window):]}} {
			if len(part.words) == 0 {
				continue
			}
			p := filepath.Join(dir, part.name)
			if err := os.WriteFile(p, []byte(strings.Join(part.words, " ")+"\n"), 0o644); err != nil {
				return nil, fmt.Errorf("experiments: E4 own article: %w", err)
			}
			paths = append(paths, p)
		}
	}
	return paths, nil
}
