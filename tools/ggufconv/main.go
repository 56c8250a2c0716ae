// Command ggufconv converts a sentence-transformers BERT checkpoint
// (safetensors, tokenizer.json, modules.json and the pooling config) into
// a GGUF file llama.cpp runs as an encoder, with the pooling and
// normalisation the checkpoint's config asks for.
//
// It is a module of its own so that the main module does not depend on
// ollama, whose convert package does the work: `make embed-model` runs it
// once per fetch.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/ollama/ollama/convert"
)

func main() {
	in := flag.String("in", "", "directory of the checkpoint (config.json, model.safetensors, tokenizer.json, modules.json)")
	out := flag.String("out", "", "GGUF file to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "ggufconv:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	if in == "" || out == "" {
		return errors.New("--in and --out are required")
	}
	if _, err := os.Stat(in + "/config.json"); err != nil {
		return fmt.Errorf("not a checkpoint directory: %w", err)
	}
	f, err := os.Create(out + ".part")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".part")
	if err := convert.ConvertModel(os.DirFS(in), f); err != nil {
		f.Close()
		return fmt.Errorf("convert %s: %w", in, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".part", out)
}
