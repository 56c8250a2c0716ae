// Command dragon is the single binary of the project: the cloud and device
// daemons, the client, index management, profiling and benchmarks.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// commands are the subcommands; each file of this package adds its own from
// init, so that subcommands can be written independently.
var commands []func() *cobra.Command

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dragon:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var (
		verbose bool
		config  string
		root    *cobra.Command
	)
	root = &cobra.Command{
		Use:   "dragon",
		Short: "Device–cloud distributed retrieval-augmented generation",
		Long: `Device–cloud distributed retrieval-augmented generation.

Every flag can also be set as DRAGON_<COMMAND>_<FLAG> in the environment
(DRAGON_DEVICE_CLOUD_TIMEOUT=5s) or in a YAML --config file (a map per
command of flag names to values); the command line wins, then the
environment, then the file.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			// llama.cpp logs through slog's level too: its warnings (context
			// sizes, graph reservations) are noise for a CLI user.
			level := slog.LevelError
			if verbose {
				level = slog.LevelDebug
			}
			slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
			if err := checkConfigCommands(root, config); err != nil {
				return err
			}
			return applyConfig(cmd, config)
		},
	}
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "log debug output (llama.cpp's too)")
	root.PersistentFlags().StringVar(&embedModel, "embed-model", embedModel, "GGUF sentence-embedding model for dense retrieval, 'chat' for the chat model's own (prompt-pooled) states, or 'random' for meaningless random vectors (synthetic corpora); an index is searched with the embedder it was built with")
	root.PersistentFlags().StringVar(&config, "config", "", "YAML file of flag values by command (see dragon --help)")
	for _, c := range commands {
		root.AddCommand(c())
	}
	return root.ExecuteContext(ctx)
}

// defaultModel is the model used when --model is not given: $DRAGON_MODEL,
// else the file `make model` fetches.
func defaultModel() string {
	if m := os.Getenv("DRAGON_MODEL"); m != "" {
		return m
	}
	return "models/SmolLM2-135M-Instruct.Q4_1.gguf"
}
