package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/dragon-rag/dragon/engine/llamacpp"
	"github.com/dragon-rag/dragon/kvcache"
)

// kvCacheFlags configure a daemon's KV prefix cache.
type kvCacheFlags struct {
	memoryMB, diskMB int
	dir              string
}

func (f *kvCacheFlags) register(fs *pflag.FlagSet, memoryMB int) {
	fs.IntVar(&f.memoryMB, "kv-cache-mb", memoryMB, "host memory for cached passage and conversation KV states, in MiB (0: none)")
	fs.StringVar(&f.dir, "kv-cache-dir", "", "also keep cached KV states in this folder, so a restarted daemon starts warm (dragon index warm fills it)")
	fs.IntVar(&f.diskMB, "kv-cache-disk-mb", 4096, "disk budget of --kv-cache-dir, in MiB")
}

func (f *kvCacheFlags) validate() error {
	switch {
	case f.memoryMB < 0:
		return fmt.Errorf("--kv-cache-mb %d: need 0 or more", f.memoryMB)
	case f.dir != "" && f.diskMB < 1:
		return fmt.Errorf("--kv-cache-disk-mb %d: need at least 1 with --kv-cache-dir", f.diskMB)
	}
	return nil
}

// open makes the cache (nil when neither tier is on), its metrics
// registered with reg when reg is not nil.
func (f *kvCacheFlags) open(modelPath string, reg prometheus.Registerer, log *slog.Logger) (*kvcache.Cache, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	if f.memoryMB == 0 && f.dir == "" {
		return nil, nil
	}
	ns, err := kvNamespace(modelPath)
	if err != nil {
		return nil, err
	}
	cfg := kvcache.Config{Namespace: ns, MemoryBytes: int64(f.memoryMB) << 20, Log: log}
	if f.dir != "" {
		cfg.Dir, cfg.DiskBytes = f.dir, int64(f.diskMB)<<20
	}
	if reg != nil {
		cfg.Observer = kvcache.NewMetrics(reg)
	}
	c, err := kvcache.New(cfg)
	if err != nil {
		return nil, err
	}
	st := c.Stats()
	log.Info("kv cache", "memory_mb", f.memoryMB, "dir", f.dir, "disk_entries", st.Entries, "disk_bytes", st.DiskBytes, "refused", st.Refused)
	return c, nil
}

// kvNamespace keys cached KV states by the model file's bytes (a path can
// be rewritten in place), the llama.cpp build and the KV settings of the
// decoders' contexts (per-sequence streams, not unified).
func kvNamespace(modelPath string) (string, error) {
	fh, err := os.Open(modelPath)
	if err != nil {
		return "", fmt.Errorf("kv cache: %w", err)
	}
	defer fh.Close()
	h := sha256.New()
	if _, err := io.Copy(h, fh); err != nil {
		return "", fmt.Errorf("kv cache: reading the model: %w", err)
	}
	return kvcache.Namespace(hex.EncodeToString(h.Sum(nil)), llamacpp.Build, llamacpp.KVSettings(false)...), nil
}
