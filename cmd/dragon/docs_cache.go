package main

import (
	"log/slog"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/kvcache"
	"github.com/dragon-rag/dragon/retrieval"
)

// minCachedRun is the shortest run of a deleted passage's tokens looked
// for in the KV cache's entries: long enough that no other passage shares
// it by chance.
const minCachedRun = 8

// dropCachedPassages returns the library's OnRemove for a daemon with a
// KV cache: the entries holding a removed passage go from memory and
// disk, so nothing of a deleted document is restored. A passage's tokens
// inside a prompt can differ from its own tokenization at its two ends
// (merges across "Passage:\n" and the blank line after), so its interior
// is matched.
func dropCachedPassages(c *kvcache.Cache, m engine.Model, log *slog.Logger) func([]retrieval.Passage) {
	if c == nil {
		return nil
	}
	return func(ps []retrieval.Passage) {
		var runs [][]engine.Token
		for _, p := range ps {
			toks, err := m.Tokenize(p.Text, false, false)
			if err != nil {
				log.Warn("kv cache: could not tokenize a removed passage; its entries stay until evicted", "err", err)
				continue
			}
			if len(toks) >= minCachedRun+3 {
				runs = append(runs, toks[1:len(toks)-2])
			}
		}
		if n := c.DropContaining(runs); n > 0 {
			log.Info("kv cache: dropped the entries of removed passages", "entries", n, "passages", len(ps))
		}
	}
}
