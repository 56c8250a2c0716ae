package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/dragon-rag/dragon/cloud"
	"github.com/dragon-rag/dragon/device"
	"github.com/dragon-rag/dragon/library"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

func init() { commands = append(commands, newCloudCmd) }

func newCloudCmd() *cobra.Command {
	var (
		f          sideFlags
		limit      cloud.Config
		adminToken string
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
			if adminToken == "" {
				adminToken = os.Getenv("DRAGON_ADMIN_TOKEN")
			}
			f.writableIndex = adminToken != ""
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
			h := newHTTPServer(s.registry, f.pprof, nil, s.backendReady)
			var docs *device.Documents
			switch {
			case adminToken != "" && s.index == nil:
				return errors.New("--admin-token serves the document API of a local index; this cloud has none (--index '' or a remote backend)")
			case adminToken != "":
				lib := library.New(s.index, library.Options{Logger: log, Limits: library.Limits{FileBytes: 64 << 20}})
				ctx, cancel := context.WithCancel(cmd.Context())
				done := make(chan struct{})
				go func() { defer close(done); lib.Run(ctx) }()
				defer func() { cancel(); <-done }()
				docs = device.NewAdminDocuments(lib, adminToken, log)
				docs.Register(h.mux)
				// Its own token: the devices' peer token must not change the corpus.
				f.grpc.NoAuthMethods = append(f.grpc.NoAuthMethods, device.DocumentMethods()...)
				log.Info("serving the document API of the public corpus, behind the admin token")
			}
			return serveAll(cmd.Context(), log, &f, h, func(g *grpc.Server) {
				dragonv1.RegisterPeerServiceServer(g, srv)
				if docs != nil {
					dragonv1.RegisterDocumentServiceServer(g, docs)
				}
			})
		},
	}
	f.register(cmd, cloudDefaults)
	fs := cmd.Flags()
	fs.IntVar(&limit.MaxSessions, "max-sessions", 4, "generations decoded at once, their rows batched into shared forward passes")
	fs.IntVar(&limit.MaxQueue, "max-queue", 4, "generations that may wait for one of those (0: none; beyond: refused with RESOURCE_EXHAUSTED)")
	fs.DurationVar(&limit.QueueTimeout, "queue-timeout", 10*time.Second, "longest wait in the queue")
	fs.DurationVar(&limit.SessionTimeout, "session-timeout", 5*time.Minute, "longest generation")
	fs.StringVar(&adminToken, "admin-token", "", "serve the document API (dragon.v1.DocumentService, /v1/documents) of a local --index behind this token, apart from the devices' --token (also $DRAGON_ADMIN_TOKEN, kept off the command line)")
	fs.IntVar(&limit.PrefillChunk, "prefill-chunk", 64, "most prompt rows of one session in a shared forward pass (a longer prefill goes in pieces)")
	return cmd
}
