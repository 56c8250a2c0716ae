package main

import (
	"fmt"
	"os"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/retrieval"
)

// embedModel is --embed-model: the sentence-embedding model of dense
// retrieval, or chatEmbedder for the chat model's own prompt-pooled states.
var embedModel = defaultEmbedModel()

// chatEmbedder names the chat model's prompt-pooled embedding (PromptEOL),
// the dense retriever before a real embedding model shipped.
const chatEmbedder = "chat"

// defaultEmbedModel is $DRAGON_EMBED_MODEL, else the file `make
// embed-model` converts.
func defaultEmbedModel() string {
	if m := os.Getenv("DRAGON_EMBED_MODEL"); m != "" {
		return m
	}
	return "models/all-MiniLM-L6-v2.Q8_0.gguf"
}

// randomEmbedder names retrieval.RandomEmbedder (384 dimensions, as
// MiniLM's), for synthetic corpora too large to embed.
const randomEmbedder = "random"

// newEmbedder returns the embedder spec names (a GGUF path, chatEmbedder or
// randomEmbedder) and the func that frees it.
func newEmbedder(spec string, chat engine.Model, threads int) (retrieval.Embedder, func(), error) {
	if spec == randomEmbedder {
		return retrieval.RandomEmbedder{Dims: 384}, func() {}, nil
	}
	if spec == chatEmbedder {
		e := retrieval.NewEngineEmbedder(chat, retrieval.EngineEmbedderOptions{Threads: threads})
		return e, func() { e.Close() }, nil
	}
	m, err := llamacpp.Load(spec, llamacpp.Options{Threads: threads})
	if err != nil {
		return nil, nil, fmt.Errorf("embedding model: %w (make embed-model fetches the default one; --embed-model chat embeds with the chat model)", err)
	}
	if m.Info().Pooling == "" {
		m.Close()
		return nil, nil, fmt.Errorf("--embed-model %s is not an embedding model (its metadata names no pooling); use --embed-model chat to embed with the chat model", spec)
	}
	e := retrieval.NewEngineEmbedder(m, retrieval.EngineEmbedderOptions{Threads: threads})
	return e, func() { e.Close(); m.Close() }, nil
}

// indexEmbedder returns the embedder a dense index was built with: the
// chat model's when its fingerprint says so, else --embed-model (Open
// refuses it if it is another model than the index's).
func indexEmbedder(man retrieval.Manifest, chat engine.Model, threads int) (retrieval.Embedder, func(), error) {
	if man.Embedder == retrieval.NewEngineEmbedder(chat, retrieval.EngineEmbedderOptions{}).Fingerprint() {
		return newEmbedder(chatEmbedder, chat, threads)
	}
	if r := (retrieval.RandomEmbedder{Dims: 384}); man.Embedder == r.Fingerprint() {
		return r, func() {}, nil
	}
	return newEmbedder(embedModel, chat, threads)
}
