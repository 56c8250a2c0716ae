package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/nodebench"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
	"github.com/dragon-rag/dragon/sampling"
	"github.com/dragon-rag/dragon/sources"
	"github.com/dragon-rag/dragon/specdec"
)

func init() { commands = append(commands, newAskCmd) }

// openSearcher opens what --index names: a Weaviate collection
// (weaviate:// or weaviate+https:// URL) or a local index folder (also
// bleve:DIR). The returned func closes what it opened.
func openSearcher(spec string, m engine.Model, threads int, writable bool) (retrieval.Searcher, func(), error) {
	if !isRemoteIndex(spec) {
		ix, closeIx, err := openIndexFor(strings.TrimPrefix(spec, "bleve:"), m, threads, !writable)
		if err != nil {
			return nil, nil, err
		}
		return ix, closeIx, nil
	}
	store, err := weaviate.Open(spec)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wspec, err := store.Spec(ctx)
	if err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("retrieval backend %s: %w", store, err)
	}
	var emb retrieval.Embedder
	closeEmb := func() {}
	if wspec.Embedder != "" {
		if emb, closeEmb, err = indexEmbedder(retrieval.Manifest{Embedder: wspec.Embedder}, m, threads); err != nil {
			store.Close()
			return nil, nil, err
		}
	}
	r, err := retrieval.OpenRemote(ctx, store, emb)
	if err != nil {
		closeEmb()
		store.Close()
		return nil, nil, err
	}
	return r, func() { closeEmb(); store.Close() }, nil
}

// openIndex opens an index read-only; dense search uses the embedder the
// index was built with (indexEmbedder) when it has vectors. The returned
// func closes what it opened.
func openIndex(dir string, m engine.Model, threads int) (*retrieval.Index, func(), error) {
	return openIndexFor(dir, m, threads, true)
}

// openIndexFor opens an index read-only or, for the daemon that is its
// writer, for writing.
func openIndexFor(dir string, m engine.Model, threads int, readOnly bool) (*retrieval.Index, func(), error) {
	man, err := retrieval.ReadManifest(dir)
	if err != nil {
		return nil, nil, err
	}
	opts := retrieval.Options{ReadOnly: readOnly, Tokenizer: m, DeferVectors: !readOnly}
	closeEmb := func() {}
	if man.Dense {
		if opts.Embedder, closeEmb, err = indexEmbedder(man, m, threads); err != nil {
			return nil, nil, err
		}
	}
	ix, err := retrieval.Open(dir, opts)
	if err != nil {
		closeEmb()
		return nil, nil, err
	}
	return ix, func() {
		ix.Close()
		closeEmb()
	}, nil
}

func newAskCmd() *cobra.Command {
	var (
		modelPath, indexDir, question, modeName, aggName string
		threads, k, maxTokens                            int
		noSpec, quiet                                    bool
		sharesOf                                         string
		treeBudget                                       int
		sp                                               sampling.Params
		remote                                           remoteAsk
	)
	cmd := &cobra.Command{
		Use:   "ask [--device ADDR] [--question] TEXT",
		Short: "Ask a question: through a device daemon (--device), or with one side alone (--index)",
		Long: `With --device ADDR, asks the device daemon at ADDR, which answers with the
cloud as the mode says (dragon by default), streams the answer and ends
with a summary (TTFT, tokens/s, mode, acceptance per side, aggregator
switches, bytes each way; --json prints it as one JSON object).

Without --device, answers in this process from one side alone: retrieve
from --index, decode one sequence per passage, mix.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if question != "" {
					return errors.New("give the question once: as an argument or with --question")
				}
				question = args[0]
			}
			if question == "" {
				return errors.New("no question: dragon ask \"...\"")
			}
			if remote.device != "" {
				remote.sampling, remote.maxTokens, remote.k = sp, maxTokens, k
				if !cmd.Flags().Changed("k") {
					remote.k = 0
				}
				if !cmd.Flags().Changed("max-tokens") {
					remote.maxTokens = 0
				}
				return remote.ask(cmd, question)
			}
			mode, err := retrieval.ParseMode(modeName)
			if err != nil {
				return err
			}
			agg, err := decoder.ParseMode(aggName)
			if err != nil {
				return err
			}
			m, err := llamacpp.Load(modelPath, llamacpp.Options{Threads: threads})
			if err != nil {
				return err
			}
			defer m.Close()
			var passages []decoder.Passage
			if indexDir != "" {
				ix, closeIx, err := openIndex(indexDir, m, threads)
				if err != nil {
					return err
				}
				hits, err := ix.Search(cmd.Context(), question, k, mode)
				closeIx()
				if err != nil {
					return err
				}
				passages = nodebench.Passages(hits)
			}
			opts := decoder.Options{MaxPassages: max(k, 1), CtxPerSeq: 1024, Threads: threads, Mode: agg}
			if !noSpec {
				opts.Spec = specdec.DefaultOptions()
				opts.Spec.TreeBudget = treeBudget
			}
			d, err := decoder.New(m, opts)
			if err != nil {
				return err
			}
			defer d.Close()
			if !quiet {
				for i, p := range passages {
					fmt.Fprintf(os.Stderr, "[passage %d, R=%.2f] %s: %.80q\n", i+1, p.Score, p.Source, p.Text)
				}
			}
			out := cmd.OutOrStdout()
			if sharesOf != "" {
				return printShares(cmd.Context(), out, d, question, passages, sharesOf)
			}
			res, err := d.Generate(cmd.Context(), decoder.Request{Query: question, Passages: passages, Sampling: sp, MaxTokens: maxTokens},
				func(_ engine.Token, text string) error {
					_, err := fmt.Fprint(out, text)
					return err
				})
			if err != nil {
				return err
			}
			fmt.Fprintln(out)
			if !quiet {
				fmt.Fprintf(os.Stderr, "[%d passages, ttft %.0f ms, %d tokens at %.1f tok/s, %d forward passes, %d draft tokens accepted]\n",
					len(passages), res.TTFTMS, len(res.Tokens), res.TokensPerSecond(), res.Steps, res.Spec.AcceptedTokens)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", defaultModel(), "GGUF model file")
	f.StringVar(&indexDir, "index", "", "index directory (none: the model alone)")
	f.StringVar(&question, "question", "", "the question")
	f.StringVar(&modeName, "retrieval", "auto", "ranker: auto, bm25, dense or hybrid")
	f.StringVar(&aggName, "aggregation", "output", "output (a sequence per passage) or context (one concatenated prompt)")
	f.IntVarP(&k, "k", "k", 4, "passages to retrieve (with --device: on the device; default the daemon's)")
	f.IntVar(&threads, "threads", 2, "compute threads")
	f.IntVar(&maxTokens, "max-tokens", 128, "most tokens to generate (with --device: default the daemon's)")
	f.BoolVar(&noSpec, "no-spec", false, "turn local speculative decoding off")
	f.IntVar(&treeBudget, "tree-budget", 1, "most draft nodes of a token tree (1: linear drafts; each of a tree's branches, at most 4, takes a KV sequence of its own per passage)")
	f.BoolVarP(&quiet, "quiet", "q", false, "print the answer only")
	f.StringVar(&sharesOf, "shares-of", "", "without --device: decode this answer instead of generating one, and print after each of its tokens each passage's share of the answer so far (the mixture's posterior, as an answer's sources give it)")
	addSamplingFlags(f, &sp)
	remote.register(cmd)
	return cmd
}

// printShares decodes answer over passages, token by token, and prints
// after each token the text so far and each passage's share of it: the
// mixture's posterior given those tokens (sources.Shares over the
// passages' relevance and evidence).
func printShares(ctx context.Context, w io.Writer, d *decoder.Decoder, question string, passages []decoder.Passage, answer string) error {
	if len(passages) == 0 {
		return errors.New("--shares-of needs passages: give an --index")
	}
	d.SetEvidence(true)
	if err := d.Begin(ctx, question, passages, nil); err != nil {
		return err
	}
	toks, err := d.Model().Tokenize(answer, false, false)
	if err != nil {
		return err
	}
	scores := make([]float64, len(passages))
	for i, p := range passages {
		scores[i] = p.Score
		fmt.Fprintf(w, "passage %d: R=%.3f %s %q\n", i+1, p.Score, p.Source, sources.Excerpt(p.Text, 80))
	}
	detok := engine.NewDetokenizer(d.Model())
	var text strings.Builder
	for n, t := range toks {
		if _, err := d.Next(ctx); err != nil {
			return err
		}
		d.Push(t)
		text.WriteString(detok.Add(t))
		ll, err := d.Evidence(ctx, n+1)
		if err != nil {
			return err
		}
		_, shares := sources.Shares(scores, ll)
		fmt.Fprintf(w, "%-64q", text.String())
		for _, s := range shares {
			fmt.Fprintf(w, " %.3f", s)
		}
		fmt.Fprintln(w)
	}
	return nil
}
