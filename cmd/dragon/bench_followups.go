package main

import (
	"encoding/json"
	"fmt"
	"runtime"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/retrievalbench"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
)

func init() { benchCommands = append(benchCommands, newBenchFollowUpsCmd) }

// followUpsReport is `dragon bench followups --json`.
type followUpsReport struct {
	Date  string                          `json:"date"`
	CPUs  int                             `json:"cpus"`
	Index string                          `json:"index"`
	Mode  string                          `json:"mode"`
	Seed  uint64                          `json:"seed"`
	Runs  []retrievalbench.FollowUpResult `json:"runs"`
	// Examples are the first conversations, to show how they were made.
	Examples []retrievalbench.Conversation `json:"examples"`
}

func newBenchFollowUpsCmd() *cobra.Command {
	var (
		modelPath, indexDir, modeName string
		n, threads                    int
		seed                          uint64
		asJSON                        bool
	)
	cmd := &cobra.Command{
		Use:   "followups",
		Short: "How often a follow-up question retrieves what its conversation is about, with the conversation and without",
		Long: `Makes --conversations two-turn conversations over the mail of --index: for a
mail drawn at random (--seed) whose subject has three words or more, the first
turn asks "What did the mail about <subject> say?" and the second is a follow-up
naming nothing of it ("Who sent it?", "When was that sent?", "What else did it
say?", "Can you tell me more about that?"). It then retrieves k passages for
the follow-up with its own words alone and with the conversation's retrieval
query (the daemons': the last user turns and the follow-up), and reports how
often the mail is among them, beside the first turn's rate. It also asks, as
the second turn, the next conversation's first question (a new subject) with
the conversation's retrieval query, and reports how often that mail is found.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mode, err := retrieval.ParseMode(modeName)
			if err != nil {
				return err
			}
			m, err := llamacpp.Load(modelPath, llamacpp.Options{Threads: threads})
			if err != nil {
				return err
			}
			defer m.Close()
			ix, closeIx, err := openIndex(indexDir, m, threads)
			if err != nil {
				return err
			}
			defer closeIx()
			convs := retrievalbench.MakeConversations(ix.Passages(), n, seed)
			rep := followUpsReport{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Index: indexDir, Mode: mode.String(), Seed: seed}
			rep.Examples = convs[:min(3, len(convs))]
			for _, k := range []int{2, 5} {
				r, err := retrievalbench.FollowUps(cmd.Context(), ix, mode, convs, k)
				if err != nil {
					return err
				}
				rep.Runs = append(rep.Runs, r)
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d conversations over %s (%s retrieval):\n", len(convs), indexDir, mode)
			for _, r := range rep.Runs {
				fmt.Fprintf(cmd.OutOrStdout(), "  k=%d: first turn %.2f; follow-up alone %.2f, with the conversation %.2f; a new subject with the conversation %.2f\n",
					r.K, r.First, r.LastMessage, r.Conversation, r.Switch)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&modelPath, "model", "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "model whose tokenizer the index was cut with")
	f.StringVar(&indexDir, "index", "data/index-qwen/device", "a mailbox's index")
	f.StringVar(&modeName, "retrieval", "auto", "retrieval mode: auto, bm25, dense or hybrid")
	f.IntVar(&n, "conversations", 100, "conversations to make")
	f.Uint64Var(&seed, "seed", 1, "which mails")
	f.IntVar(&threads, "threads", 1, "threads")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
