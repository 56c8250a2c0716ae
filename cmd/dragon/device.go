package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/dragon-rag/dragon/device"
	"github.com/dragon-rag/dragon/library"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/specdec"
	"github.com/dragon-rag/dragon/specdec/historyfile"
	"github.com/dragon-rag/dragon/webui"
	"github.com/dragon-rag/dragon/wire"
)

func init() { commands = append(commands, newDeviceCmd) }

func newDeviceCmd() *cobra.Command {
	var (
		f             sideFlags
		cloudAddr     string
		cloudPassages int
		mode          string
		cloudTimeout  time.Duration
		idleUnload    time.Duration
		maxQueue      int
		queueTimeout  time.Duration
		historyTokens int
		historyFile   string
		modelID       string
		maxUploadMB   int
		watch         []string
		peer          wire.Config
	)
	cmd := &cobra.Command{
		Use:   "device",
		Short: "Run the device daemon: the private corpus and the model, serving local apps, with the cloud as peer",
		Long: `Serves dragon.v1.DeviceService (and grpc.health.v1) on --listen for local
apps (dragon ask --device ADDR), and an OpenAI-compatible HTTP API
(/v1/chat/completions, /v1/completions, /v1/models; the same --token as API
key) with /metrics, /healthz and /readyz on --http. Each generation retrieves from this
device's corpus and opens a peer stream to the cloud at --cloud (empty:
device-only). With no flags it serves the model and index that make run
builds on 127.0.0.1:7071 and uses the cloud on 127.0.0.1:7070, without TLS
(loopback only).`,
		RunE: func(cmd *cobra.Command, args []string) error {
			log := daemonLog(cmd, "device")
			def, err := parseModeName(mode)
			if err != nil {
				return fmt.Errorf("--mode: %w", err)
			}
			if cloudPassages < 0 || cloudPassages > f.maxPassages {
				return fmt.Errorf("--cloud-passages %d: need 0 ≤ cloud-passages ≤ max-passages %d", cloudPassages, f.maxPassages)
			}
			if queueTimeout <= 0 || maxQueue < 0 {
				return fmt.Errorf("--queue-timeout %v, --max-queue %d: need a positive wait and a queue of 0 or more", queueTimeout, maxQueue)
			}
			if idleUnload < 0 {
				return fmt.Errorf("--idle-unload %v: need 0 (never) or more", idleUnload)
			}
			if idleUnload > 0 && f.draftModel != "" {
				return fmt.Errorf("--idle-unload %v with --draft-model: the model loaded back after idling would draft alone; leave one of them off", idleUnload)
			}
			if historyTokens < 0 || (historyFile != "" && historyTokens == 0) {
				return fmt.Errorf("--history-tokens %d, --history-file %q: a file needs a store of 1 token or more", historyTokens, historyFile)
			}
			f.writableIndex = true
			s, err := f.load(log)
			if err != nil {
				return err
			}
			defer s.close()
			if historyTokens > 0 && s.decoder.Spec.Enabled {
				hist, err := historyfile.Load(historyFile, historyTokens)
				if historyFile == "" {
					hist, err = specdec.NewHistory(historyTokens)
				}
				if err != nil {
					return fmt.Errorf("--history-file: %w", err)
				}
				s.decoder.History = hist
				log.Info("drafting from earlier answers", "history_tokens", historyTokens, "held", hist.Tokens(), "file", historyFile)
				if historyFile != "" {
					defer func() {
						if err := historyfile.Save(hist, historyFile); err != nil {
							log.Error("the earlier answers were not saved", "err", err)
						}
					}()
				}
			}
			// --memory-mb may have lowered --max-passages.
			cloudPassages = min(cloudPassages, f.maxPassages)
			if maxQueue == 0 {
				maxQueue = -1 // the flag's 0 means no queue
			}
			cfg := device.Config{SideConfig: s.config(log), StallTimeout: cloudTimeout, IdleUnload: idleUnload, MaxQueue: maxQueue, QueueTimeout: queueTimeout}
			cloudState := func() string { return "none (device-only)" }
			cfg.Defaults = session.Defaults{MaxTokens: f.maxTokens, PassagesDevice: f.passages, PassagesCloud: cloudPassages, Mode: def, PosteriorEvery: f.posteriorEvery}
			if cloudAddr != "" {
				if peer.Token == "" {
					peer.Token = os.Getenv("DRAGON_CLOUD_TOKEN")
				}
				autoInsecure(&peer, cloudAddr)
				opts, err := peer.DialOptions()
				if err != nil {
					return fmt.Errorf("cloud connection: %w", err)
				}
				// Reconnect soon after the cloud comes back: the next
				// generation should use it, not answer alone.
				opts = append(opts, grpc.WithConnectParams(grpc.ConnectParams{
					Backoff:           backoff.Config{BaseDelay: 200 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
					MinConnectTimeout: 5 * time.Second,
				}),
					// A name with several cloud replicas (dns:/// on a headless
					// Service): spread the generations' streams over them.
					grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
				conn, err := grpc.NewClient(cloudAddr, opts...)
				if err != nil {
					return fmt.Errorf("cloud connection: %w", err)
				}
				defer conn.Close()
				conn.Connect()
				cfg.Peer = dragonv1.NewPeerServiceClient(conn)
				cloudState = func() string { return strings.ToLower(conn.GetState().String()) }
			} else if def != dragonv1.Mode_MODE_DEVICE_ONLY {
				cfg.Defaults.Mode = dragonv1.Mode_MODE_DEVICE_ONLY
			}
			srv, err := device.New(cfg)
			if err != nil {
				return err
			}
			defer srv.Close()
			h := newHTTPServer(s.registry, f.pprof, func() string {
				model := "loaded"
				if !srv.ModelLoaded() {
					model = "unloaded while idle (the next request loads it)"
				}
				return "cloud: " + cloudState() + "\nmodel: " + model
			}, s.backendReady)
			if modelID == "" {
				modelID = strings.TrimSuffix(filepath.Base(f.model), ".gguf")
			}
			device.NewOpenAI(srv, modelID, f.grpc.Token).Register(h.mux)
			defaults := webui.Defaults{Mode: session.ModeName(cfg.Defaults.Mode), PassagesDevice: cfg.Defaults.PassagesDevice,
				PassagesCloud: cfg.Defaults.PassagesCloud, MaxTokens: cfg.Defaults.MaxTokens}
			webui.Register(h.mux, webui.Config{
				Guard: func(h http.HandlerFunc) http.HandlerFunc { return device.Guard(f.grpc.Token, h) },
				Status: func() webui.Status {
					return webui.Status{
						DeviceModel: modelID, Generating: srv.Generating(), Queued: srv.Queued(), Documents: s.index != nil,
						Cloud:    webui.CloudStatus{Configured: cloudAddr != "", State: cloudState(), Model: srv.CloudModel()},
						Defaults: defaults, Modes: session.ModeNames(),
					}
				},
			})
			var docs *device.Documents
			if s.index == nil && len(watch) > 0 {
				return errors.New("--watch needs a local --index to keep in sync")
			}
			if s.index != nil {
				lib := library.New(s.index, library.Options{
					Limits: library.Limits{FileBytes: int64(maxUploadMB) << 20}, Busy: srv.Generating,
					OnRemove: dropCachedPassages(s.decoder.Cache, s.model, log), Logger: log,
					Checkpointed: debug.FreeOSMemory,
				})
				// The library's last checkpoint comes before the index
				// closes (deferred above).
				ctx, cancel := context.WithCancel(cmd.Context())
				var wg sync.WaitGroup
				wg.Go(func() { lib.Run(ctx) })
				defer func() { cancel(); wg.Wait() }()
				for _, dir := range watch {
					if err := checkFolder(dir); err != nil {
						return fmt.Errorf("--watch %s: %w", dir, err)
					}
					wg.Go(func() {
						if err := lib.Watch(ctx, dir); err != nil {
							log.Error("watching a folder failed", "folder", dir, "err", err)
						}
					})
				}
				docs = device.NewDocuments(lib, f.grpc.Token, log)
				docs.Register(h.mux)
			}
			return serveAll(cmd.Context(), log, &f, h, func(g *grpc.Server) {
				dragonv1.RegisterDeviceServiceServer(g, srv)
				if docs != nil {
					dragonv1.RegisterDocumentServiceServer(g, docs)
				}
			})
		},
	}
	f.register(cmd, deviceDefaults)
	fs := cmd.Flags()
	fs.StringVar(&cloudAddr, "cloud", defaultCloudAddr, "the cloud daemon's address (empty: device-only)")
	fs.IntVar(&cloudPassages, "cloud-passages", 2, "passages the cloud retrieves when a request does not say")
	fs.StringVar(&mode, "mode", "dragon", "mode when a request does not say: dragon, tw, sw, device-only, cloud-only, context or kv")
	fs.StringVar(&modelID, "model-id", "", "model id of the OpenAI-compatible API on --http (default: the model file's name without .gguf)")
	fs.DurationVar(&cloudTimeout, "cloud-timeout", 10*time.Second, "finish an answer alone when the cloud answers no handshake or decides no step for this long (it is also finished alone when the cloud goes away)")
	fs.IntVar(&f.memoryMB, "memory-mb", 0, "memory budget in MiB for the weights, llama.cpp's compute buffer, --kv-cache-mb and the context's KV: lowers --max-passages to what fits; below the weights, streams them from the file, the part that fits locked in memory (0: no budget; see deploy/phone/README.md)")
	fs.IntVar(&f.streamReaders, "stream-readers", 4, "with --memory-mb below the weights: threads that read each layer's streamed weights into one of two layer buffers, the next layer while this one runs (0: the pass's page faults read them, one readahead at a time)")
	fs.IntVar(&maxUploadMB, "max-upload-mb", 64, "the largest file the document API takes, in MiB")
	fs.StringArrayVar(&watch, "watch", nil, "keep this folder's files in the index: new, changed and removed files within seconds, and what changed while the daemon was down (repeatable)")
	fs.IntVar(&historyTokens, "history-tokens", 0, "local speculative decoding also drafts from this device's earlier answers, up to this many tokens of them (kept on the device, never sent; 0: off)")
	fs.StringVar(&f.draftModel, "draft-model", "", "local speculative decoding also drafts from this smaller model of the same tokenizer, kept in memory (Lever's draft model; with --memory-mb counted in the budget, and locked when the model is streamed); the cost model takes its draft when it expects more tokens per millisecond from it (empty: none)")
	fs.StringVar(&historyFile, "history-file", "", "with --history-tokens: keep the earlier answers in this file across restarts (read at start, written at a clean stop)")
	fs.IntVar(&maxQueue, "max-queue", 4, "generations that may wait while one is generated (the page and an app asking at once); beyond, refused with a time to retry after (0: none)")
	fs.DurationVar(&queueTimeout, "queue-timeout", 2*time.Minute, "longest wait in that queue")
	fs.DurationVar(&idleUnload, "idle-unload", 0, "after this long without a request, free the model and its context (memory goes back to the OS); the next request loads them back (0: never)")
	peer.RegisterFlags(fs, "cloud-") // --cloud-token may also come from $DRAGON_CLOUD_TOKEN
	return cmd
}

// checkFolder fails unless dir is a folder.
func checkFolder(dir string) error {
	info, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return errors.New("not a folder")
	}
	return nil
}
