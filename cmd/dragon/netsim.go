package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/netsim"
)

func init() { commands = append(commands, newNetsimCmd) }

// netsimFlags are the flags of dragon netsim.
type netsimFlags struct {
	listen, upstream, trace, control string
	kind, rate, upRate, downRate     string
	latency, upLatency, downLatency  time.Duration
	jitter, period, stallFor         time.Duration
	stallProb                        float64
	seed                             uint64
}

func newNetsimCmd() *cobra.Command {
	var f netsimFlags
	cmd := &cobra.Command{
		Use:   "netsim --listen ADDR --upstream ADDR [--latency 150ms --jitter 30ms --rate 1MB/s ...]",
		Short: "Forward TCP through an emulated link (latency, jitter, bandwidth, stalls, resets, traces)",
		Long: `Listens on --listen and forwards every connection to --upstream through an
emulated link, each direction's bytes kept in order and shaped by:

  latency   one-way delay (--latency, or --up-latency/--down-latency)
  jitter    added to it: normal (--jitter is the standard deviation),
            uniform (the half-width) or sine (the amplitude of
            jitter·sin(2π t / --period), t from the start)
  rate      bandwidth in bytes/s: 125000, 1MB/s, 1.5MiB, 8mbit (bits
            spelled out; 0 is unlimited); a chunk waits for those before it
            and size/rate to leave, then the latency
  stalls    with --stall-prob per chunk the direction stops for --stall-for,
            as a lost segment stalls a TCP stream
  trace     --trace FILE replays a CSV of "time,latency_ms" lines (time in
            seconds from the start, increasing; header optional) as both
            directions' latency: a step function holding the last value

--control ADDR serves an HTTP API to change all of it while connections run:

  curl ADDR/shape
  curl -X PUT ADDR/shape -d '{"up":{"latency":"300ms","rate":"1MB/s"}}'
  curl -X PUT ADDR/shape -d '{"both":{"stall_prob":0.01,"stall_for":"200ms"}}'
  curl -X POST ADDR/reset    # reset every connection (RST at both ends)

Put it between a device and its cloud:

  dragon cloud --listen 127.0.0.1:7070 &
  dragon netsim --listen 127.0.0.1:7170 --upstream 127.0.0.1:7070 --latency 150ms --jitter 30ms &
  dragon device --cloud 127.0.0.1:7170 &`,
		RunE: func(cmd *cobra.Command, args []string) error { return runNetsim(cmd, &f) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.listen, "listen", "", "address to listen on (host:port)")
	fs.StringVar(&f.upstream, "upstream", "", "address to forward to (host:port)")
	fs.DurationVar(&f.latency, "latency", 0, "one-way latency of each direction")
	fs.DurationVar(&f.upLatency, "up-latency", 0, "one-way latency client → upstream (default --latency)")
	fs.DurationVar(&f.downLatency, "down-latency", 0, "one-way latency upstream → client (default --latency)")
	fs.DurationVar(&f.jitter, "jitter", 0, "jitter: standard deviation (normal), half-width (uniform) or amplitude (sine)")
	fs.StringVar(&f.kind, "jitter-kind", "normal", "jitter kind: normal, uniform or sine")
	fs.DurationVar(&f.period, "period", netsim.DefaultPeriod, "period of sine jitter")
	fs.StringVar(&f.rate, "rate", "0", "bandwidth of each direction in bytes/s (1MB/s, 8mbit; 0: unlimited)")
	fs.StringVar(&f.upRate, "up-rate", "0", "bandwidth client → upstream (default --rate)")
	fs.StringVar(&f.downRate, "down-rate", "0", "bandwidth upstream → client (default --rate)")
	fs.Float64Var(&f.stallProb, "stall-prob", 0, "probability that a chunk stalls its direction, in [0, 1]")
	fs.DurationVar(&f.stallFor, "stall-for", 0, "how long a stall lasts")
	fs.StringVar(&f.trace, "trace", "", `CSV file of "time,latency_ms" lines replayed as both directions' latency`)
	fs.StringVar(&f.control, "control", "", "address of the HTTP control API (host:port; none if empty)")
	fs.Uint64Var(&f.seed, "seed", 1, "seed of the jitter and stalls")
	return cmd
}

func runNetsim(cmd *cobra.Command, f *netsimFlags) error {
	if f.listen == "" || f.upstream == "" {
		return errors.New("--listen and --upstream are required")
	}
	upShape, downShape, err := f.shapes(cmd.Flags().Changed)
	if err != nil {
		return err
	}
	up, err := netsim.NewDirection(upShape, f.seed)
	if err != nil {
		return fmt.Errorf("client → upstream: %w", err)
	}
	down, err := netsim.NewDirection(downShape, f.seed+1)
	if err != nil {
		return fmt.Errorf("upstream → client: %w", err)
	}
	if f.trace != "" {
		pts, err := readTrace(f.trace)
		if err != nil {
			return err
		}
		for _, d := range []*netsim.Direction{up, down} {
			if err := d.Replay(pts); err != nil {
				return fmt.Errorf("--trace %s: %w", f.trace, err)
			}
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	p, err := netsim.NewProxy(f.listen, f.upstream, &netsim.Link{Up: up, Down: down}, log)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", f.listen, err)
	}
	if f.control != "" {
		ln, err := net.Listen("tcp", f.control)
		if err != nil {
			p.Close()
			return fmt.Errorf("--control %s: %w", f.control, err)
		}
		srv := &http.Server{Handler: p.ControlHandler(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				log.Error("netsim control stopped", "err", err)
			}
		}()
		defer srv.Close()
		log.Info("netsim control", "addr", ln.Addr().String())
	}
	log.Info("netsim forwarding", "listen", p.Addr(), "upstream", f.upstream, "up", upShape, "down", downShape, "trace", f.trace)
	return p.Serve(cmd.Context())
}

// shapes checks the flags and builds each direction's shape; changed
// tells which flags were given, so that --up-x and --down-x override --x.
func (f *netsimFlags) shapes(changed func(string) bool) (up, down netsim.Shape, err error) {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"latency", f.latency}, {"up-latency", f.upLatency}, {"down-latency", f.downLatency},
		{"jitter", f.jitter}, {"period", f.period}, {"stall-for", f.stallFor},
	} {
		if d.v < 0 {
			return up, down, fmt.Errorf("--%s %v: must not be negative", d.name, d.v)
		}
	}
	if !(f.stallProb >= 0 && f.stallProb <= 1) { // NaN too
		return up, down, fmt.Errorf("--stall-prob %v: want a probability in [0, 1]", f.stallProb)
	}
	if f.stallProb > 0 && f.stallFor == 0 {
		return up, down, errors.New("--stall-prob needs --stall-for, how long a stall lasts")
	}
	kind, err := netsim.ParseJitter(f.kind)
	if err != nil {
		return up, down, fmt.Errorf("--jitter-kind: %w", err)
	}
	var rates [3]netsim.Rate // --rate, --up-rate, --down-rate
	for i, r := range []struct{ name, v string }{{"rate", f.rate}, {"up-rate", f.upRate}, {"down-rate", f.downRate}} {
		if rates[i], err = netsim.ParseRate(r.v); err != nil {
			return up, down, fmt.Errorf("--%s: %w", r.name, err)
		}
	}
	up = netsim.Shape{
		Latency: f.latency, Jitter: f.jitter, Dist: kind, Period: f.period,
		Rate: rates[0], StallProb: f.stallProb, StallFor: f.stallFor,
	}
	down = up
	if changed("up-latency") {
		up.Latency = f.upLatency
	}
	if changed("down-latency") {
		down.Latency = f.downLatency
	}
	if changed("up-rate") {
		up.Rate = rates[1]
	}
	if changed("down-rate") {
		down.Rate = rates[2]
	}
	return up, down, nil
}

// readTrace parses a trace file.
func readTrace(path string) ([]netsim.TracePoint, error) {
	r, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--trace: %w", err)
	}
	defer r.Close()
	pts, err := netsim.ParseTrace(r)
	if err != nil {
		return nil, fmt.Errorf("--trace %s: %w", path, err)
	}
	return pts, nil
}
