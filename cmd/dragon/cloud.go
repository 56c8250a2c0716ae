package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/dragon-rag/dragon/cloud"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

func init() { commands = append(commands, newCloudCmd) }

func newCloudCmd() *cobra.Command {
	var (
		f     sideFlags
		limit cloud.Config
	)
	cmd := &cobra.Command{
		Use:   "cloud",
		Short: "Run the cloud daemon: the public corpus and the model, serving devices' peer streams",
		Long: `Serves dragon.v1.PeerService (and grpc.health.v1) on --listen: each device
generation opens a stream, the cloud retrieves its own passages for the
query and decodes them, and the two sides combine their distributions as
the device asked (dragon, tw, sw, cloud-only, context). With no flags it
serves the model and index that make run builds, on 127.0.0.1:7070, without
TLS (loopback only; elsewhere give --tls-cert/--tls-key or --insecure).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := daemonLog(cmd, "cloud")
			s, err := f.load(log)
			if err != nil {
				return err
			}
			defer s.close()
			if limit.MaxSessions < 1 || limit.QueueTimeout <= 0 || limit.SessionTimeout <= 0 || limit.PrefillChunk < 1 {
				return fmt.Errorf("--max-sessions, --queue-timeout, --session-timeout and --prefill-chunk must be positive")
			}
			if limit.MaxQueue == 0 {
				limit.MaxQueue = -1 // the flag's 0 means no queue
			}
			limit.SideConfig = s.config(log)
			limit.Defaults = session.Defaults{MaxTokens: f.maxTokens, PassagesDevice: f.passages, PassagesCloud: f.passages, PosteriorEvery: f.posteriorEvery}
			srv, err := cloud.New(limit)
			if err != nil {
				return err
			}
			defer srv.Close()
			return serveAll(cmd.Context(), log, &f, newHTTPServer(s.registry, f.pprof, nil, s.backendReady), func(g *grpc.Server) {
				dragonv1.RegisterPeerServiceServer(g, srv)
			})
		},
	}
	f.register(cmd, cloudDefaults)
	fs := cmd.Flags()
	fs.IntVar(&limit.MaxSessions, "max-sessions", 4, "generations decoded at once, their rows batched into shared forward passes")
	fs.IntVar(&limit.MaxQueue, "max-queue", 4, "generations that may wait for one of those (0: none; beyond: refused with RESOURCE_EXHAUSTED)")
	fs.DurationVar(&limit.QueueTimeout, "queue-timeout", 10*time.Second, "longest wait in the queue")
	fs.DurationVar(&limit.SessionTimeout, "session-timeout", 5*time.Minute, "longest generation")
	fs.IntVar(&limit.PrefillChunk, "prefill-chunk", 64, "most prompt rows of one session in a shared forward pass (a longer prefill goes in pieces)")
	return cmd
}
