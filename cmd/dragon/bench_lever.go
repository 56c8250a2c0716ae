package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/leverbench"
)

func init() { benchCommands = append(benchCommands, newBenchLeverCmd) }

func newBenchLeverCmd() *cobra.Command {
	var (
		o     leverbench.Options
		child string
	)
	cmd := &cobra.Command{
		Use:   "lever",
		Short: "A model larger than its memory budget (Lever): plain decoding, linear speculation, token trees and a draft model under a cgroup v1 memory limit, beside the same model unbudgeted",
		Long: `Runs each mode (--modes: unbudgeted, plain, linear, trees, draft, trees-draft) as a process of
its own, one thread, decoding the same --n built-in prompts (one passage
each) greedily for --max-tokens. Every budgeted mode runs inside a cgroup
v1 memory group (/sys/fs/cgroup/memory, root) limited to --budget-mb plus
the process's own baseline, page cache included, and the model file is
dropped from the page cache before each mode: what the budget cannot hold
is read from storage again by every forward pass. It reports tokens/s,
passes per token, MB read from storage per token (/proc/self/io), accepted
tokens per pass, the peak memory charged and the median time to first
token, and whether every mode's greedy output equals the unbudgeted one.
With --pin (the default) a budgeted mode locks the weights the budget
holds beside what it already uses and room for two layers, in the
file's order, the token embeddings (read a row a token) never; the rest
is read once a pass, with --readers (default 4, as the device) into two
layer buffers, the next layer while this one runs. With --follow-ups the
prompts are held-out ones each followed by a related one, and the
speculative modes also draft from the earlier answers. The draft mode also keeps --draft-model locked in
memory within the same budget (Lever's draft model) and drafts from it or
from the context, whichever the cost model expects more of per millisecond;
trees-draft grows token trees from the context with the draft model's
greedy draft as one more branch. --repeats N runs the modes in turn N
times and reports each mode's median run, every run's tokens/s beside it:
on shared storage single runs of the same mode differ by 1.5×.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if child != "" {
				return leverbench.Child(cmd.Context(), os.Stdin, cmd.OutOrStdout(), leverbench.ChildOptions{Mode: child, Settings: o.Settings})
			}
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Self = self
			o.Log = func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			rep, err := leverbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			return writeJSON(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", "models/Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "the target model (make qwen)")
	f.StringVar(&o.DraftModel, "draft-model", "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "the draft mode's smaller model of the same tokenizer, locked in memory within the budget (make qwen)")
	f.StringVar(&o.Corpus, "corpus", "data/corpus", "corpus folder of the built-in prompt set (make corpus)")
	f.IntVar(&o.Prompts, "n", 4, "prompts")
	f.BoolVar(&o.FollowUps, "follow-ups", false, "held-out prompts, each followed by its question in other words over the same passage, with the speculative modes also drafting from a store of the earlier answers (related prompts)")
	f.IntVar(&o.MaxTokens, "max-tokens", 32, "tokens decoded per prompt")
	f.IntVar(&o.MaxDraft, "max-draft", 0, "longest draft of the speculative modes, in tokens (0: the drafter's default, 8)")
	f.BoolVar(&o.VerifyAll, "verify-all", false, "verify every draft whole, the cost model off (the most tokens a pass the drafts give)")
	f.IntVar(&o.Repeats, "repeats", 1, "runs of every mode, the modes in turn; each mode reports its median run by tokens/s")
	f.IntVar(&o.BudgetMB, "budget-mb", 600, "memory budget, MiB, beside the process's own baseline")
	f.StringSliceVar(&o.Modes, "modes", leverbench.Modes, "modes to run, in order (the first is the greedy reference)")
	f.BoolVar(&o.Pin, "pin", true, "lock the part of the weights the budget holds (every pass reads the rest from storage once); false leaves it to the kernel's LRU")
	f.StringVar((*string)(&o.Advice), "advice", "sequential", "madvise of the model's mapping under the budget: normal, sequential or random (with --readers, the layers' pages, read into buffers, are advised random, as the device does)")
	f.IntVar(&o.Readers, "readers", 4, "threads that read each layer's unpinned weights into a layer buffer under the budget, as the device's --stream-readers (0: the pass's page faults read them)")
	f.StringVar(&child, "child", "", "run one mode as the child of a run (internal)")
	_ = f.MarkHidden("child")
	f.Bool("json", true, "print the report as JSON (always)")
	return cmd
}
