// Package testmodel locates the real model and corpora for tests. They are
// required, not optional: `make test` fetches them, and a test that cannot
// find them fails rather than skips, so CI always exercises the real model.
package testmodel

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the repository root, from this file's location.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Path is the default GGUF model: $DRAGON_MODEL, else models/ in the
// repository.
func Path(t testing.TB) string {
	t.Helper()
	p := os.Getenv("DRAGON_MODEL")
	if p == "" {
		p = filepath.Join(Root(), "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
	}
	return mustExist(t, p, "default model", "model")
}

// QwenDevicePath is DRAGON's device model, Qwen2.5-Coder-0.5B-Instruct
// Q4_K_M: $DRAGON_QWEN_DEVICE, else models/ in the repository (`make qwen`).
func QwenDevicePath(t testing.TB) string {
	t.Helper()
	return modelFile(t, "DRAGON_QWEN_DEVICE", "Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf", "Qwen device model", "qwen")
}

// QwenCloudPath is DRAGON's cloud model, Qwen2.5-Coder-1.5B-Instruct
// Q4_K_M, of the same tokenizer: $DRAGON_QWEN_CLOUD, else models/.
func QwenCloudPath(t testing.TB) string {
	t.Helper()
	return modelFile(t, "DRAGON_QWEN_CLOUD", "Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf", "Qwen cloud model", "qwen")
}

// modelFile is $env, else models/name, which must exist.
func modelFile(t testing.TB, env, name, what, target string) string {
	t.Helper()
	p := os.Getenv(env)
	if p == "" {
		p = filepath.Join(Root(), "models", name)
	}
	return mustExist(t, p, what, target)
}

// EmbedPath is the sentence-embedding model, all-MiniLM-L6-v2 as GGUF
// Q8_0: $DRAGON_EMBED_MODEL, else models/ in the repository (`make
// embed-model`).
func EmbedPath(t testing.TB) string {
	t.Helper()
	p := os.Getenv("DRAGON_EMBED_MODEL")
	if p == "" {
		p = filepath.Join(Root(), "models", "all-MiniLM-L6-v2.Q8_0.gguf")
	}
	return mustExist(t, p, "embedding model", "embed-model")
}

// EmbedF16Path is the embedding model as converted, before quantization.
func EmbedF16Path(t testing.TB) string {
	t.Helper()
	return mustExist(t, filepath.Join(Root(), "models", "all-MiniLM-L6-v2.F16.gguf"), "converted embedding model", "embed-model")
}

// mustExist returns p, or fails the test saying which make target makes it.
func mustExist(t testing.TB, p, what, target string) string {
	t.Helper()
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found at %s: run `make %s` (%v)", what, p, target, err)
	}
	return p
}

// RerankPath is the cross-encoder ms-marco-MiniLM-L-12-v2 as converted to
// GGUF: $DRAGON_RERANK_MODEL, else models/ (`make rerank-model`).
func RerankPath(t testing.TB) string {
	t.Helper()
	return modelFile(t, "DRAGON_RERANK_MODEL", "ms-marco-MiniLM-L-12-v2.F32.gguf", "re-ranking model", "rerank-model")
}

// RerankONNX is the ONNX file the re-ranking model was converted from
// (`make rerank-model` keeps it), for reference scores computed without
// llama.cpp.
func RerankONNX(t testing.TB) string {
	t.Helper()
	return mustExist(t, filepath.Join(Root(), "models", "ms-marco-MiniLM-L-12-v2", "model.onnx"), "cross-encoder ONNX file", "rerank-model")
}

// EmbedCheckpoint is the sentence-transformers checkpoint the embedding
// model was converted from (`make embed-model` keeps it), for reference
// vectors computed without llama.cpp.
func EmbedCheckpoint(t testing.TB) string {
	t.Helper()
	p := filepath.Join(Root(), "models", "all-MiniLM-L6-v2")
	if _, err := os.Stat(filepath.Join(p, "model.safetensors")); err != nil {
		t.Fatalf("checkpoint not found at %s: run `make embed-model` (%v)", p, err)
	}
	return p
}

// CorpusDir is data/corpus of the repository (`make corpus`).
func CorpusDir(t testing.TB) string {
	t.Helper()
	p := filepath.Join(Root(), "data", "corpus")
	for _, c := range []string{"sotu", "mail"} {
		if _, err := os.Stat(filepath.Join(p, c)); err != nil {
			t.Fatalf("corpus %s not found under %s: run `make corpus` (%v)", c, p, err)
		}
	}
	return p
}

// FormatsDir is data/formats of the repository (`make formats`): real PDF,
// HTML and DOCX files and their reference texts.
func FormatsDir(t testing.TB) string {
	t.Helper()
	p := filepath.Join(Root(), "data", "formats")
	if _, err := os.Stat(filepath.Join(p, "SOURCES")); err != nil {
		t.Fatalf("real files not found: run `make formats` (%v)", err)
	}
	return p
}

// IndexCopy is a copy of IndexDir(t, side) in a temporary folder, for a
// daemon that writes its index (the device): tests must not change the
// repository's, and two devices cannot share one.
func IndexCopy(t testing.TB, side string) string {
	t.Helper()
	src := IndexDir(t, side)
	dst := filepath.Join(t.TempDir(), side)
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatalf("copy index %s: %v", src, err)
	}
	return dst
}

// IndexDir is data/index/<side> of the repository (`make index`).
func IndexDir(t testing.TB, side string) string {
	t.Helper()
	p := filepath.Join(Root(), "data", "index", side)
	if _, err := os.Stat(filepath.Join(p, "manifest.json")); err != nil {
		t.Fatalf("index %s not found: run `make index` (%v)", p, err)
	}
	return p
}
