package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/qabench"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/rerank"
	"github.com/dragon-rag/dragon/retrieval"
)

func init() { benchCommands = append(benchCommands, newBenchQACmd) }

// qaSplitVersion names the way qabench.Split halves the corpus; a change
// must not reuse the indexes of another split.
const qaSplitVersion = "fnv32a-mod2-v1"

func newBenchQACmd() *cobra.Command {
	var (
		o                       qabench.Options
		wiki, work, modes, tops string
		n, threads              int
		asJSON                  bool
	)
	cmd := &cobra.Command{
		Use:   "qa",
		Short: "Open-domain question answering across the two sides: exact match, F1 and answer-contained per mode, with time per token and TTFT",
		Long: `Splits make wiki's Wikipedia deterministically into a cloud half (public)
and a device half (standing in for private data), indexes each with the
default retriever (BM25 + MiniLM, passages cut by that side's model), and
asks N of DPR's Natural Questions and TriviaQA test questions whose answer
some passage holds (sampled with --seed) through a live cloud daemon (core
0) and device daemon (core 1), one thread each, in each mode: none (the
device's model alone), device-only, cloud-only, context (both sides'
passages in one prompt on the device: DRCG/Text) and dragon. Greedy, k
passages per side, a short-answer instruction as the system message.
Answers are scored with SQuAD's normalisation (exact match, token F1) and
DPR's has-answer test (contained). Every answer is appended to --records
as it comes, so an interrupted run resumes where it stopped; progress and
an ETA go to stderr. Needs make wiki, make embed-model and the models.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			logf := func(format string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", a...) }
			if o.CloudModel == "" {
				o.CloudModel = o.DeviceModel
			}
			o.Modes = strings.Split(modes, ",")
			if err := qabench.CheckModes(o.Modes); err != nil {
				return err
			}
			// Before any file is named or written after them.
			var err error
			if o.ClosedBookSides, err = qabench.CheckClosedBook(o.ClosedBook, o.ClosedBookSides); err != nil {
				return err
			}
			if n < 1 || o.K < 1 || o.MaxTokens < 1 {
				return fmt.Errorf("--n, --k and --max-tokens must be at least 1")
			}
			cloudFiles, deviceFiles, err := qabench.Split(wiki)
			if err != nil {
				return err
			}
			var cloudPassages, devicePassages []string
			if o.CloudIndex, cloudPassages, o.CloudPassages, err = qaIndex(ctx, work, "cloud", o.CloudModel, cloudFiles, threads, logf); err != nil {
				return err
			}
			if o.DeviceIndex, devicePassages, o.DevicePassages, err = qaIndex(ctx, work, "device", o.DeviceModel, deviceFiles, threads, logf); err != nil {
				return err
			}
			qs, err := qabench.LoadTopics(strings.Split(tops, ",")...)
			if err != nil {
				return err
			}
			var answerable int
			o.Questions, answerable = qabench.Sample(qs, append(cloudPassages, devicePassages...), n, o.Seed)
			logf("qa: %d of %d questions have an answer in the %d + %d passages; asking %d (seed %d)",
				answerable, len(qs), len(cloudPassages), len(devicePassages), len(o.Questions), o.Seed)
			if o.Records == "" {
				ranker := ""
				if o.Retrieval != "" && o.Retrieval != "auto" {
					ranker = "-" + o.Retrieval
				}
				switch o.Weights {
				case "rerank":
					ranker += fmt.Sprintf("-rerank%d", o.RerankCandidates)
				case "dynamic":
					ranker += fmt.Sprintf("-rerank%d-every%d", o.RerankCandidates, o.RescoreEvery)
				case "posterior":
					ranker += fmt.Sprintf("-posterior%d", o.PosteriorEvery)
				case "rerank-posterior":
					ranker += fmt.Sprintf("-rerank%d-posterior%d", o.RerankCandidates, o.PosteriorEvery)
				}
				if o.Confidence > 0 {
					ranker += "-conf" + strconv.FormatFloat(o.Confidence, 'f', -1, 64)
				}
				if o.ClosedBook != "" {
					ranker += "-closed" + o.ClosedBook
					ranker += o.ClosedBookSides // "" for both
				}
				o.Records = filepath.Join(work, fmt.Sprintf("records-%s-%s-k%d-t%d-s%d%s.jsonl",
					modelStem(o.DeviceModel), modelStem(o.CloudModel), o.K, o.MaxTokens, o.Seed, ranker))
			}
			// The questions asked, for asking another pairing the same
			// ones (--questions FILE); not over the file they came from,
			// whose line numbers the records name.
			topics := strings.TrimSuffix(o.Records, ".jsonl") + ".questions.tsv"
			if !slices.ContainsFunc(strings.Split(tops, ","), func(p string) bool { return filepath.Clean(p) == filepath.Clean(topics) }) {
				if err := qabench.WriteTopics(topics, o.Questions); err != nil {
					return err
				}
				logf("qa: the questions asked are in %s", topics)
			}
			if o.Binary, err = os.Executable(); err != nil {
				return err
			}
			o.Log = logf
			res, err := qabench.Run(ctx, o)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), res)
			}
			printQA(cmd.OutOrStdout(), res, o.Modes)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DeviceModel, "device-model", defaultModel(), "the device's GGUF model")
	f.StringVar(&o.CloudModel, "cloud-model", "", "the cloud's GGUF model (default: the device's); of the same tokenizer")
	f.StringVar(&o.DeviceProfile, "device-profile", "", "the device's dragon profile fit (empty: none)")
	f.StringVar(&o.CloudProfile, "cloud-profile", "", "the cloud's dragon profile fit (empty: none)")
	f.StringVar(&wiki, "wiki", "data/corpus/wiki", "the Wikipedia corpus of make wiki")
	f.StringVar(&tops, "questions", "data/corpus/questions/nq.test.tsv,data/corpus/questions/trivia.test.tsv", "topics files (question TAB python-list-of-answers, as make wiki writes them), comma-separated")
	f.StringVar(&work, "work", "data/qa", "folder of the halves' indexes and the records")
	f.StringVar(&o.Records, "records", "", "per-question records (JSON lines; resumed when present; default under --work, named by the configuration)")
	f.StringVar(&modes, "modes", strings.Join(qabench.Modes, ","), "modes to ask, comma-separated (also tw)")
	f.IntVar(&n, "n", 300, "questions to ask")
	f.IntVar(&o.K, "k", 2, "passages per side")
	f.StringVar(&o.Retrieval, "retrieval", "", "both daemons' ranker: auto (hybrid over these indexes), bm25, dense or hybrid; its scores are the passages' relevance R(d), so they weigh the two sides against each other")
	f.StringVar(&o.Weights, "weights", "static", "how passages are weighed: static (the first stage's scores), rerank (--rerank-model re-ranks --rerank-candidates passages on each side; R is its logit), dynamic (re-ranked, then re-scored against the answer every --rescore-every tokens), posterior (the first stage's R, then every --posterior-every tokens each passage's posterior given the answer so far) or rerank-posterior (the re-ranker's R, then the posterior)")
	f.IntVar(&o.PosteriorEvery, "posterior-every", 4, "answer tokens between posterior weightings for --weights posterior and rerank-posterior")
	f.Float64Var(&o.Confidence, "confidence", 0, "confidence weights: each step's side weights also fall with the entropy of each side's distribution, e^{-H/τ} with τ this temperature in nats (0: DRAGON's weights)")
	f.StringVar(&o.ClosedBook, "closed-book", "", "the daemons of --closed-book-sides add the closed-book document (the question alone) to every retrieval at this relevance, on the ranker's scale (daemon flag --closed-book; empty: off)")
	f.StringVar(&o.ClosedBookSides, "closed-book-sides", "both", "the daemons that add the closed-book document: both, cloud or device")
	f.IntVar(&o.RescoreEvery, "rescore-every", 16, "answer tokens between re-scorings for --weights dynamic")
	f.StringVar(&o.RerankModel, "rerank-model", "models/ms-marco-MiniLM-L-12-v2.F32.gguf", "cross-encoder GGUF for --weights rerank (make rerank-model)")
	f.IntVar(&o.RerankCandidates, "rerank-candidates", rerank.DefaultCandidates, "first-stage passages re-ranked per side for --weights rerank")
	f.IntVar(&o.MaxTokens, "max-tokens", 32, "most tokens per answer")
	f.Uint64Var(&o.Seed, "seed", 1, "question sampling seed")
	f.IntVar(&threads, "threads", 2, "threads for building the indexes")
	f.BoolVar(&asJSON, "json", false, "print one JSON object")
	return cmd
}

// qaIndex opens, or builds once, the index of one half of the corpus for a
// side's model: passages are cut by that model's tokenizer, so the folder
// is named by the tokenizer's fingerprint, the embedding model and the
// split. It returns the folder and the passages' texts.
func qaIndex(ctx context.Context, work, side, model string, files []string, threads int, logf func(string, ...any)) (string, []string, map[uint64]string, error) {
	m, err := llamacpp.Load(model, llamacpp.Options{Threads: threads})
	if err != nil {
		return "", nil, nil, err
	}
	defer m.Close()
	id := sha256.Sum256([]byte(m.Info().Fingerprint + "|" + filepath.Base(embedModel) + "|" + qaSplitVersion))
	dir := filepath.Join(work, fmt.Sprintf("index-%s-%x", side, id[:6]))
	ix, err := retrieval.Open(dir, retrieval.Options{})
	if err != nil {
		logf("qa: indexing the %s half (%d files) into %s...", side, len(files), dir)
		emb, closeEmb, err := newEmbedder(embedModel, m, threads)
		if err != nil {
			return "", nil, nil, err
		}
		defer closeEmb()
		start := time.Now()
		bar := newProgressBar(os.Stderr, false)
		ix, _, err = retrieval.Build(ctx, dir, retrieval.Options{Tokenizer: m, Embedder: emb, Progress: bar.update}, files...)
		bar.done()
		if err != nil {
			return "", nil, nil, fmt.Errorf("qa: index of the %s half: %w", side, err)
		}
		logf("qa: %s half indexed in %v", side, time.Since(start).Round(time.Second))
	}
	defer ix.Close()
	var texts []string
	byID := map[uint64]string{}
	for _, p := range ix.Passages() {
		texts = append(texts, p.Text)
		byID[p.ID] = p.Text
	}
	return dir, texts, byID, nil
}

// modelStem is a model file's name without its extension.
func modelStem(path string) string {
	return strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
}

func printQA(w io.Writer, r qabench.Result, modes []string) {
	fmt.Fprintf(w, "%d questions, k = %d, device %s, cloud %s, weights %s (records: %s)\n", r.N, r.K, r.DeviceModel, r.CloudModel, r.Weights, r.Records)
	fmt.Fprintf(w, "%-12s %6s %6s %9s %12s %9s %10s %10s %10s\n", "mode", "EM", "F1", "contained", "ms/token", "TTFT ms", "top share", "top score", "any source")
	for _, m := range modes {
		fmt.Fprintf(w, "%-12s %6.3f %6.3f %9.3f %12.1f %9.0f", m, r.EM[m], r.F1[m], r.Contained[m], r.PerTokenMS[m], r.TTFTMS[m])
		if n := r.SourcesCounted[m]; n > 0 {
			// Of the answers that contain a gold answer, those whose
			// largest-share (highest-score) source holds it.
			fmt.Fprintf(w, " %10.3f %10.3f %10.3f", r.TopSourceContainsAnswer[m], r.TopScoreContainsAnswer[m], r.AnySourceContainsAnswer[m])
		}
		fmt.Fprintln(w)
	}
}
