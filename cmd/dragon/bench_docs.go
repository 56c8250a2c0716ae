package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/docsbench"
	"github.com/dragon-rag/dragon/bench/promptset"
)

func init() { benchCommands = append(benchCommands, newBenchDocsCmd) }

func newBenchDocsCmd() *cobra.Command {
	var (
		o      docsbench.Options
		asJSON bool
		nq     int
	)
	cmd := &cobra.Command{
		Use:   "docs",
		Short: "The document API on a running device: ingestion, ack to retrievable, TTFT while ingesting, kill -9, growth with the mailbox",
		Long: `Starts a device daemon (device-only, one thread) on an empty index and feeds
it --mailbox over HTTP (/v1/documents, --batch files a request), then
measures: the ingestion rate; acknowledged to retrievable (a file of a word of
its own, searched until found, 50 times); the 95th percentile of time to first
token of --questions questions idle and while a second copy of the mailbox
is fed; search p95, single-file add p50 and resident memory at each of
--scales copies of the mailbox (fed again under new names); --kills kill -9
cycles on another index, counting acknowledged files missing after each
restart; and extraction on make formats' real files (--formats).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Binary == "" {
				self, err := os.Executable()
				if err != nil {
					return err
				}
				o.Binary = self
			}
			work, err := os.MkdirTemp("", "dragon-bench-docs-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			o.Work = work
			o.Questions = promptset.Questions[:min(nq, len(promptset.Questions))]
			o.Log = func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			rep, err := docsbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			rep.CPUs = runtime.NumCPU()
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d mails: %.1f docs/s, %.2f MB/s; ack to retrievable p50 %.1f ms, p99 %.1f ms\n",
				rep.MailFiles, rep.IngestDocsPerS, rep.IngestMBPerS, rep.AckToRetrievableMS.P50, rep.AckToRetrievableMS.P99)
			fmt.Fprintf(w, "TTFT p95: idle %.0f ms, ingesting %.0f ms (%.2fx; %d questions answered during ingestion)\n",
				rep.TTFTP95MS.Idle, rep.TTFTP95MS.Ingesting, rep.TTFTP95MS.Ingesting/rep.TTFTP95MS.Idle, rep.TTFTDuringIngestion)
			fmt.Fprintf(w, "kill -9: %d lost of %d acknowledged over %d kills\n", rep.LostAfterKill, rep.AckedBeforeKills, rep.Kills)
			for _, p := range rep.Scale {
				fmt.Fprintf(w, "%2dx: %7d passages, search p95 %.1f ms, add p50 %.1f ms, RSS %.0f MB\n", p.Copies, p.Passages, p.SearchP95MS, p.AddMSP50, p.RSSMB)
			}
			for f, s := range rep.Formats {
				fmt.Fprintf(w, "%s: %d files, %d scored, median F1 %.3f, min %.3f, %d failed\n", f, s.Files, s.Scored, s.MedianF1, s.MinF1, s.Failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", "models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "the device's model")
	f.StringVar(&o.Mailbox, "mailbox", "data/corpus/mail", "a folder of .eml files")
	f.StringVar(&o.Formats, "formats", "data/formats", "make formats' real files, scored for extraction (empty: not scored)")
	f.IntSliceVar(&o.Scales, "scales", []int{1, 4, 10}, "copies of the mailbox to measure at")
	f.IntVar(&o.Kills, "kills", 20, "kill -9 cycles")
	f.IntVar(&o.Batch, "batch", 256, "files per upload request")
	f.IntVar(&nq, "questions", 8, "questions for the time to first token")
	f.StringVar(&o.EmbedModel, "dense-embed-model", "", "make the device's index dense, embedded with this model (a GGUF, or random: vectors of no meaning, for memory and speed at scale); empty: BM25 only, as make run's")
	f.StringVar(&o.Cores, "cores", "1", "taskset cores of the device (empty: any)")
	f.StringVar(&o.Binary, "binary", "", "the dragon binary to run the device with (default: this one)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
