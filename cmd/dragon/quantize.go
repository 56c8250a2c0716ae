package main

import (
	"strings"

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
		Long: "Rewrite a GGUF model with another weight type, every matrix in that one type. Types differ\n" +
			"in speed per pass (by the kernels this CPU has) and in quality (the default model ships as 4-bit\n" +
			"Q4_1, so another 4-bit type loses some): docs/BENCHMARKS.md measures both.",
		RunE: func(cmd *cobra.Command, args []string) error {
			return llamacpp.Quantize(in, out, ftype, threads)
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "in", "", "input GGUF")
	f.StringVar(&out, "out", "", "output GGUF")
	f.StringVar(&ftype, "type", "q8_0", "weight type: "+strings.Join(llamacpp.WeightTypes(), ", "))
	f.IntVar(&threads, "threads", 2, "threads")
	_ = cmd.MarkFlagRequired("in")
	_ = cmd.MarkFlagRequired("out")
	return cmd
}
