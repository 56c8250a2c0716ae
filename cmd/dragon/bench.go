package main

import (
	"encoding/json"
	"io"
	"os"
	"runtime/pprof"

	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newBenchCmd) }

// benchCommands are the subcommands of `dragon bench`; each file adds its own.
var benchCommands []func() *cobra.Command

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure components on the real model (JSON with --json)",
	}
	for _, c := range benchCommands {
		cmd.AddCommand(c())
	}
	return cmd
}

// writeJSON prints v as one indented JSON object.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// startProfile starts a CPU profile when path is set; call the returned func
// to stop it.
func startProfile(path string) (func(), error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
