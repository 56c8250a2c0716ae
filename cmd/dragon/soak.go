package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/bench/soakbench"
)

func init() { commands = append(commands, newSoakCmd) }

func newSoakCmd() *cobra.Command {
	var (
		o       soakbench.Options
		minutes float64
		nq      int
		asJSON  bool
	)
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "A bounded chaos run on loopback: a cloud and N devices, links that change shape, stall and reset, a killed device, a restarted cloud, a failing cache disk",
		Long: `Starts one cloud and --devices device daemons (as processes of this binary,
one thread each), each device behind a netsim link of its own, asks each
question once over clean links (the fault-free answers), then asks
questions without pause on every device for --minutes while every 1.5 s one
link gets a new shape: latency 0-300 ms with jitter, stalls shorter and
longer than the devices' --cloud-timeout, a bandwidth drop, or a reset of
its connections. Once each, it kills a device mid-answer (kill -9) and
restarts it, restarts the cloud, and breaks the cloud's KV-cache disk.

Every answer ends with the cloud, alone (a fallback, counted by the
devices' reason), refused (by gRPC code), or cut (its device was killed).
The tokens decided with the cloud must equal the fault-free answer's:
wrong_tokens counts those that do not. It also reports the daemons'
goroutines before and after (every link clean again and no session open),
open sessions at the end, the largest RSS seen, and the faults injected.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Start = func(name string, args []string) (*aggbench.Daemon, error) {
				return aggbench.StartDaemon(name, "", nil, append([]string{self}, args...)...)
			}
			work, err := os.MkdirTemp("", "dragon-soak-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			o.Work, o.Duration = work, time.Duration(minutes*float64(time.Minute))
			o.Questions = promptset.Questions[:min(nq, len(promptset.Questions))]
			o.Log = func(format string, args ...any) { fmt.Fprintf(cmd.ErrOrStderr(), format+"\n", args...) }
			rep, err := soakbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(rep)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%d answers in %.0f s on %d devices: %d with the cloud, fallbacks %v, refused %v, %d cut by a kill\n",
				rep.Answers, rep.Seconds, rep.Devices, rep.WithCloud, rep.Fallback, rep.Refused, rep.Cut)
			fmt.Fprintf(w, "wrong tokens: %d; goroutines %d -> %d; sessions open at the end %d; RSS max device %.0f MB, cloud %.0f MB\n",
				rep.WrongTokens, rep.Goroutines.Start, rep.Goroutines.End, rep.SessionsOpenAtEnd, rep.RSSMB.DeviceMax, rep.RSSMB.CloudMax)
			fmt.Fprintf(w, "faults: %v\n", rep.Faults)
			for _, x := range rep.Wrong {
				fmt.Fprintln(w, "wrong:", x)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.Devices, "devices", 4, "device daemons")
	f.Float64Var(&minutes, "minutes", 10, "how long to ask under faults")
	f.StringVar(&o.Model, "model", defaultModel(), "both sides' model")
	f.StringVar(&o.CloudIndex, "cloud-index", "data/index/cloud", "the cloud's index (make index)")
	f.StringVar(&o.DeviceIndex, "device-index", "data/index/device", "the device's index, copied for each device")
	f.IntVar(&nq, "questions", 6, "questions asked in turn")
	f.IntVar(&o.MaxTokens, "max-tokens", 12, "most tokens an answer")
	f.DurationVar(&o.CloudTimeout, "cloud-timeout", 3*time.Second, "the devices' --cloud-timeout (the long stalls outlast it)")
	f.Uint64Var(&o.Seed, "seed", 1, "the faults' seed")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
