package main

import (
	"github.com/spf13/cobra"

	"github.com/dragon-rag/dragon/engine/llamacpp"
)

func init() { commands = append(commands, newQuantizeCmd) }

func newQuantizeCmd() *cobra.Command {
	var (
		in, out, ftype string
		threads        int
	)
	cmd := &cobra.Command{
		Use:   "quantize --in MODEL --out MODEL --type q8_0",
		Short: "Rewrite a GGUF model with another weight type (llama.cpp's quantizer)",
		Long: "Rewrite a GGUF model with another weight type. The default model ships as Q4_1, whose batched\n" +
			"matrix products have no fast kernel on x86 CPUs; Q8_0 has one, which is what batched verification\n" +
			"and multi-passage decoding need (see docs/BENCHMARKS.md).",
		RunE: func(cmd *cobra.Command, args []string) error {
			return llamacpp.Quantize(in, out, ftype, threads)
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "in", "", "input GGUF")
	f.StringVar(&out, "out", "", "output GGUF")
	f.StringVar(&ftype, "type", "q8_0", "weight type: q8_0, q4_0, iq4_nl, q5_0 or f16")
	f.IntVar(&threads, "threads", 2, "threads")
	_ = cmd.MarkFlagRequired("in")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}
