// Command rerankconv converts a BERT cross-encoder from ONNX (int8
// dynamically quantized or float) into the GGUF file dragon's re-ranker
// runs through llama.cpp: float32 weights, the pooler kept, the passage's
// segment baked into a second copy of the vocabulary (internal/bertonnx).
// `make rerank-model` runs it once per fetch. It lives in the main module:
// it needs nothing beyond the protobuf wire decoder gRPC already brings.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/dragon-rag/dragon/internal/bertonnx"
)

func main() {
	in := flag.String("onnx", "", "the cross-encoder's model.onnx")
	vocab := flag.String("vocab", "", "its WordPiece vocab.txt")
	name := flag.String("name", "ms-marco-MiniLM-L-12-v2", "general.name of the GGUF")
	out := flag.String("out", "", "GGUF file to write")
	flag.Parse()
	if err := run(*in, *vocab, *name, *out); err != nil {
		fmt.Fprintln(os.Stderr, "rerankconv:", err)
		os.Exit(1)
	}
}

func run(in, vocabPath, name, out string) error {
	if in == "" || vocabPath == "" || out == "" {
		return errors.New("--onnx, --vocab and --out are required")
	}
	m, err := bertonnx.ReadFile(in)
	if err != nil {
		return err
	}
	v, err := readVocab(vocabPath)
	if err != nil {
		return err
	}
	f, err := os.Create(out + ".part")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".part")
	if err := m.WriteGGUF(f, name, v); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".part", out)
}

// readVocab reads vocab.txt (one token a line, the line number its id) and
// finds BERT's five special tokens in it.
func readVocab(path string) (bertonnx.Vocabulary, error) {
	f, err := os.Open(path)
	if err != nil {
		return bertonnx.Vocabulary{}, err
	}
	defer f.Close()
	v := bertonnx.Vocabulary{Special: map[string]bool{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v.Tokens = append(v.Tokens, strings.TrimRight(sc.Text(), "\r"))
	}
	if err := sc.Err(); err != nil {
		return v, fmt.Errorf("%s: %w", path, err)
	}
	ids := map[string]*int{"[CLS]": &v.CLS, "[SEP]": &v.SEP, "[PAD]": &v.Pad, "[UNK]": &v.Unknown, "[MASK]": &v.Mask}
	found := 0
	for i, t := range v.Tokens {
		if p, ok := ids[t]; ok {
			*p = i
			v.Special[t] = true
			found++
		}
	}
	if found != len(ids) {
		return v, fmt.Errorf("%s: not a BERT vocabulary ([CLS], [SEP], [PAD], [UNK] and [MASK] each once)", path)
	}
	return v, nil
}
