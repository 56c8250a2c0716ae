package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/netsim"
)

func init() { commands = append(commands, newNetsimCmd) }

func newNetsimCmd() *cobra.Command {
	var (
		listen, upstream, dist string
		latency, jitter        time.Duration
		upLatency, downLatency time.Duration
		seed                   uint64
	)
	cmd := &cobra.Command{
		Use:   "netsim --listen ADDR --upstream ADDR --latency 150ms --jitter 30ms",
		Short: "Forward TCP through an emulated link (one-way latency per direction, jitter)",
		Long: `Listens on --listen and forwards every connection to --upstream, delaying
each direction's bytes by the one-way latency plus jitter (normal or uniform),
in order. Put it between a device and its cloud:

  dragon cloud --listen 127.0.0.1:7070 &
  dragon netsim --listen 127.0.0.1:7170 --upstream 127.0.0.1:7070 --latency 150ms --jitter 30ms &
  dragon device --cloud 127.0.0.1:7170 &`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if listen == "" || upstream == "" {
				return fmt.Errorf("--listen and --upstream are required")
			}
			d, err := netsim.ParseJitter(dist)
			if err != nil {
				return err
			}
			up, down := latency, latency
			if cmd.Flags().Changed("up-latency") {
				up = upLatency
			}
			if cmd.Flags().Changed("down-latency") {
				down = downLatency
			}
			upDir, err := netsim.NewDirection(netsim.Shape{Latency: up, Jitter: jitter, Dist: d}, seed)
			if err != nil {
				return err
			}
			downDir, err := netsim.NewDirection(netsim.Shape{Latency: down, Jitter: jitter, Dist: d}, seed+1)
			if err != nil {
				return err
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
			p, err := netsim.NewProxy(listen, upstream, &netsim.Link{Up: upDir, Down: downDir}, log)
			if err != nil {
				return err
			}
			log.Info("netsim forwarding", "listen", p.Addr(), "upstream", upstream, "up", up, "down", down, "jitter", jitter, "dist", d)
			return p.Serve(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", "", "address to listen on (host:port)")
	f.StringVar(&upstream, "upstream", "", "address to forward to (host:port)")
	f.DurationVar(&latency, "latency", 0, "one-way latency of each direction")
	f.DurationVar(&upLatency, "up-latency", 0, "one-way latency client → upstream (default --latency)")
	f.DurationVar(&downLatency, "down-latency", 0, "one-way latency upstream → client (default --latency)")
	f.DurationVar(&jitter, "jitter", 0, "jitter: standard deviation (normal) or half-width (uniform)")
	f.StringVar(&dist, "jitter-dist", "normal", "jitter distribution: normal or uniform")
	f.Uint64Var(&seed, "seed", 1, "seed of the jitter")
	return cmd
}
