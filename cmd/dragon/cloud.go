package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/dragon-rag/dragon/cloud"
	"github.com/dragon-rag/dragon/device"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/library"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/retrieval"
	"github.com/dragon-rag/dragon/retrieval/weaviate"
	"github.com/dragon-rag/dragon/session"
)

func init() { commands = append(commands, newCloudCmd) }

func newCloudCmd() *cobra.Command {
	var (
		f          sideFlags
		limit      cloud.Config
		adminToken string
		adminIndex string
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
			remote := isRemoteIndex(f.index)
			f.writableIndex = adminToken != "" && !remote
			if adminToken != "" && remote && adminIndex == "" {
				return errors.New("--admin-token on a Weaviate --index keeps the documents it is given in --admin-index DIR (a local index, created if absent) and writes them into the collection from there")
			}
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
			case adminToken != "" && s.index == nil && !remote:
				return errors.New("--admin-token serves the document API of this cloud's corpus; it has none (--index '')")
			case adminToken != "":
				opts := library.Options{Logger: log, Limits: library.Limits{FileBytes: 64 << 20}}
				ix := s.index
				var mirror *retrieval.Mirror
				if remote {
					m, closeLedger, err := openMirror(cmd.Context(), adminIndex, f.index, s.model, f.threads, log)
					if err != nil {
						return err
					}
					defer closeLedger() // deferred first: runs after the library's last checkpoint
					mirror, ix, opts.Mark = m, m.Index(), m.Unwritten
				}
				var wg sync.WaitGroup
				ctx, cancel := context.WithCancel(cmd.Context())
				defer func() { cancel(); wg.Wait() }()
				if mirror != nil {
					wg.Go(func() { mirror.Run(ctx, 500*time.Millisecond) })
				}
				lib := library.New(ix, opts)
				wg.Go(func() { lib.Run(ctx) })
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
	fs.DurationVar(&limit.QueueTimeout, "queue-timeout", cloud.DefaultQueueTimeout, "longest wait in the queue; keep it well under the devices' --cloud-timeout, so that a full cloud refuses them with a reason before they give up on it")
	fs.DurationVar(&limit.SessionTimeout, "session-timeout", 5*time.Minute, "longest generation")
	fs.StringVar(&adminToken, "admin-token", "", "serve the document API (dragon.v1.DocumentService, /v1/documents) of the corpus behind this token, apart from the devices' --token (also $DRAGON_ADMIN_TOKEN, kept off the command line)")
	fs.StringVar(&adminIndex, "admin-index", "", "with --admin-token and a Weaviate --index: the local index folder that keeps the documents the API is given (durable at the ack) until they are written into the collection (created if absent)")
	fs.IntVar(&limit.PrefillChunk, "prefill-chunk", 64, "most prompt rows of one session in a shared forward pass (a longer prefill goes in pieces)")
	return cmd
}

// isRemoteIndex reports whether an --index names a Weaviate collection.
func isRemoteIndex(spec string) bool {
	return strings.HasPrefix(spec, "weaviate://") || strings.HasPrefix(spec, "weaviate+https://")
}

// openMirror opens (or creates) the local index that keeps the admin
// API's documents of a cloud searching a Weaviate collection, chunked,
// tokenized and embedded as the collection's passages are, and the
// mirror that writes them into the collection.
func openMirror(ctx context.Context, dir, collection string, m engine.Model, threads int, log *slog.Logger) (*retrieval.Mirror, func(), error) {
	store, err := weaviate.Open(collection)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	spec, err := store.Spec(ctx)
	if err != nil {
		store.Close()
		return nil, nil, fmt.Errorf("--admin-index: %s: %w", store, err)
	}
	opts := retrieval.Options{Tokenizer: m, DeferVectors: true, Logger: log,
		Chunk: retrieval.ChunkOptions{Tokens: spec.ChunkTokens, Overlap: spec.Overlap}}
	closeEmb := func() {}
	if spec.Embedder != "" {
		if opts.Embedder, closeEmb, err = indexEmbedder(retrieval.Manifest{Embedder: spec.Embedder}, m, threads); err != nil {
			store.Close()
			return nil, nil, err
		}
	}
	ix, err := retrieval.Open(dir, opts)
	if errors.Is(err, retrieval.ErrNoIndex) {
		log.Info("creating the admin API's index", "dir", dir, "collection", store.String())
		ix, _, err = retrieval.Build(ctx, dir, opts)
	}
	if err != nil {
		closeEmb()
		store.Close()
		return nil, nil, fmt.Errorf("--admin-index %s: %w", dir, err)
	}
	closeAll := func() { ix.Close(); closeEmb(); store.Close() }
	mir, err := retrieval.NewMirror(ctx, ix, store, log)
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("--admin-index %s: %w", dir, err)
	}
	return mir, closeAll, nil
}
