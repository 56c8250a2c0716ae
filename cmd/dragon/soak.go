package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/bench/aggbench"
	"github.com/dragon-rag/dragon/bench/promptset"
	"github.com/dragon-rag/dragon/bench/retrievalbench"
	"github.com/dragon-rag/dragon/bench/soakbench"
)

func init() { commands = append(commands, newSoakCmd) }

func newSoakCmd() *cobra.Command {
	var (
		o        soakbench.Options
		minutes  float64
		nq       int
		asJSON   bool
		weaviate bool
		script   string
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
restarts it, restarts the cloud, and fills the cloud's KV-cache disk (a
64 MB tmpfs when run as root, else a file put where its folder was).

With --documents a further device answers nothing and is given small
documents without pause, every fourth step deleting one, and is killed -9
once among them: lost_acks counts acknowledged adds that are not there or
not found by their own words at the end, and acknowledged deletes that are
back. With --weaviate the cloud searches a Weaviate node (started with
--cluster-script, the cloud index pushed into it) through a link the soak
slows, and the node is paused (SIGSTOP) once for longer than a search's
timeout.

Every answer ends with the cloud, alone (a fallback, counted by the
devices' reason), refused (by gRPC code), or cut (its device was killed).
The tokens decided with the cloud must equal the fault-free answer's:
wrong_tokens counts those that do not. It also reports the stalls the
devices survived (a wait over half their stall timeout that still ended
in a step), the daemons' goroutines before and after (every link clean
again and no session open), open sessions at the end, RSS per minute and
its growth after the warm-up, and the faults injected.`,
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
			if weaviate {
				cl, err := retrievalbench.StartScriptCluster(script, filepath.Join(work, "weaviate"), 1, 13500, nil)
				if err != nil {
					return err
				}
				defer cl.Stop()
				host := strings.TrimPrefix(cl.URL(), "http://")
				push := exec.CommandContext(cmd.Context(), self, "index", "push", "--dir", o.CloudIndex, "--to", "weaviate://"+host+"/Soak", "-q")
				if out, err := push.CombinedOutput(); err != nil {
					return fmt.Errorf("push the cloud index into Weaviate: %w\n%s", err, out)
				}
				o.Backend = &soakbench.Backend{HTTP: host, GRPC: cl.GRPC(), Collection: "Soak",
					Pause: func() error { return cl.Pause(0) }, Resume: func() error { return cl.Resume(0) }}
			}
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
			fmt.Fprintf(w, "stalls survived: %d; documents added %d, deleted %d, lost acknowledgements %d; RSS growth after %.0f s of warm-up %.1f%%\n",
				rep.StallsSurvived, rep.Documents.Added, rep.Documents.Deleted, rep.LostAcks, rep.RSSMB.WarmupS, 100*rep.RSSMB.GrowthAfterWarmup)
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
	f.BoolVar(&o.Documents, "documents", true, "add a device that is given documents and killed among them")
	f.BoolVar(&weaviate, "weaviate", false, "the cloud searches a Weaviate node the soak slows and pauses (make weaviate)")
	f.StringVar(&script, "cluster-script", "deploy/weaviate/cluster.sh", "starts the Weaviate node (its binary: $WEAVIATE_BIN or build/weaviate)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}
