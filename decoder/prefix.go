package decoder

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/kvcache"
)

// A passage sequence's prompt is (template start + passage) then the
// conversation, so its head does not depend on the question, and a later
// turn's prompt extends an earlier turn's prompt and answer. Reusing the
// KV of a shared prefix is exact: the prefix sits at the same positions
// with the same attention context either way, and each row of a forward
// pass is computed on its own, so restoring it and prefilling the rest
// gives the KV bytes and logits a full prefill gives.
//
// Three places hold prefixes, tried in this order:
//   - the sequence itself, which still holds what the last generation left
//     in it (nothing is copied; cut back to the shared length);
//   - the kvcache's memory and disk tiers, restored with the engine's
//     per-sequence state;
//   - nothing: prefill from the start.

// resident is what each sequence holds in the KV cache now: its prompt and
// answer up to the positions held (a draft beyond the answer is left out).
func (d *Decoder) resident() [][]engine.Token {
	out := make([][]engine.Token, len(d.prompts))
	for s, p := range d.prompts {
		if s >= len(d.held) {
			break
		}
		n := min(d.held[s], len(p)+len(d.gen))
		toks := make([]engine.Token, 0, n)
		toks = append(toks, p[:min(n, len(p))]...)
		if n > len(p) {
			toks = append(toks, d.gen[:n-len(p)]...)
		}
		out[s] = toks
	}
	return out
}

// cacheable reports whether this generation's own sequences may start
// from cached prefixes: not for calibration, which reads every prompt
// row's logits, nor for token trees, whose branch streams the cache does
// not restore.
func (d *Decoder) cacheable(calib bool) bool {
	return d.opts.Cache != nil && !calib && d.branches == 1
}

// templateStart is how many tokens every prompt of this system message
// shares whatever its passage (the system turn and the user turn's start):
// a hit that reuses no more than that plus a block is used but not counted
// as a restored passage.
func (d *Decoder) templateStart() int {
	system := d.opts.System
	if d.system != "" {
		system = d.system
	}
	if d.header.system == system && d.header.n > 0 {
		return d.header.n
	}
	a, errA := d.model.Tokenize(d.renderChat(system, "Passage:\na\n\n", "q"), true, true)
	b, errB := d.model.Tokenize(d.renderChat(system, "Passage:\nb\n\n", "q"), true, true)
	if errA != nil || errB != nil {
		return 0
	}
	d.header.system, d.header.n = system, kvcache.CommonPrefix(a, b)
	return d.header.n
}

// reuse starts sequence s of the new generation from the longest prefix
// of its prompt that it still holds or that the cache has; at least the
// prompt's last token is left to decode, for its logits, unless the cache
// has them too.
func (d *Decoder) reuse(s int, resident [][]engine.Token) error {
	prompt := d.prompts[s]
	limit := len(prompt) - 1
	inContext := 0
	if s < len(resident) {
		// What the engine holds bounds what the mirror says: an owner of
		// a shared context may have emptied the sequence since.
		inContext = min(kvcache.CommonPrefix(resident[s], prompt), limit, d.ectx.SeqLen(s))
	}
	counts := d.templateStart() + kvcache.BlockTokens
	if s < len(resident) && inContext == limit && len(resident[s]) >= len(prompt) && resident[s][limit] == prompt[limit] && d.ectx.SeqLen(s) >= len(prompt) {
		// The sequence holds the whole prompt: with its cached logits,
		// nothing is decoded or copied.
		if logits := d.opts.Cache.LogitsAfter(prompt); logits != nil {
			if err := d.ectx.Truncate(s, len(prompt)); err != nil {
				return err
			}
			d.held[s], d.known[s] = len(prompt), logits
			d.opts.Cache.CountContextHit()
			d.restored++
			return nil
		}
	}
	if hit, ok := d.opts.Cache.Lookup(prompt, inContext, counts); ok {
		start := time.Now()
		err := d.restore(s, hit)
		hit.Done()
		if err == nil {
			d.opts.Cache.ObserveRestore(time.Since(start))
			d.held[s] = hit.Match
			d.known[s] = hit.Logits
			if hit.Match >= counts {
				d.restored++
			}
			return nil
		}
		// The cache's bytes do not load here (a context too small for
		// the entry, say): prefill instead.
		slog.Warn("kv cache: could not restore a cached prefix; prefilling", "sequence", s, "err", err)
		if err := d.ectx.Truncate(s, 0); err != nil {
			return err
		}
		d.opts.Cache.CountMiss()
		return nil
	}
	if err := d.ectx.Truncate(s, inContext); err != nil {
		return err
	}
	d.held[s] = inContext
	if inContext >= counts {
		d.opts.Cache.CountContextHit()
		d.restored++
	} else {
		d.opts.Cache.CountMiss()
	}
	return nil
}

// restore loads a cached state into sequence s, cut to the shared prefix.
func (d *Decoder) restore(s int, hit kvcache.Hit) error {
	if err := d.ectx.Truncate(s, 0); err != nil {
		return err
	}
	if hit.Positions > d.opts.CtxPerSeq {
		return fmt.Errorf("%w: a cached state of %d positions for sequences of %d", engine.ErrContextFull, hit.Positions, d.opts.CtxPerSeq)
	}
	if err := d.ectx.SetSeqState(s, hit.State, hit.Positions); err != nil {
		return err
	}
	if hit.Match < hit.Positions {
		return d.ectx.Truncate(s, hit.Match)
	}
	return nil
}

// keepPrompts caches the prompts whose distribution was decoded, now that
// the prefill holds them, with the logits of their last row; held says
// what each sequence held before it.
func (d *Decoder) keepPrompts(held []int) {
	for s := range d.own {
		p := d.prompts[s]
		if d.known[s] != nil || d.held[s] != len(p) || len(d.lastRow[s]) == 0 {
			continue
		}
		logits := kvcache.Logits{At: len(p), Values: slices.Clone(d.lastRow[s])}
		if held[s] == len(p)-1 && d.opts.Cache.Put(p, nil, logits) {
			// Only the last row was decoded and the cache holds the
			// state already: now its logits too.
			continue
		}
		d.keep(s, p, logits)
	}
}

// keep caches what sequence s holds, which is toks.
func (d *Decoder) keep(s int, toks []engine.Token, ends ...kvcache.Logits) {
	if len(toks) < kvcache.BlockTokens {
		return
	}
	state, err := d.ectx.SeqState(s)
	if err != nil {
		slog.Warn("kv cache: could not save a sequence's state", "sequence", s, "err", err)
		return
	}
	d.opts.Cache.Put(toks, state, ends...)
}

// Retain caches what each of this generation's own sequences holds, prompt
// and answer, so that the conversation's next turn, here or on another
// decoder sharing the cache, prefills only what it adds. Call it when a
// generation is over; it does nothing without a cache.
func (d *Decoder) Retain() {
	if !d.cacheable(false) {
		return
	}
	res := d.resident()
	for s := range min(d.own, len(res)) {
		if n := len(res[s]); n < d.held[s] {
			// Drop a draft the answer did not take, so that the state
			// holds exactly the tokens it is cached under.
			if err := d.ectx.Truncate(s, n); err != nil {
				slog.Warn("kv cache: could not cut a sequence back to its answer", "sequence", s, "err", err)
				continue
			}
			d.held[s] = n
			d.nextValid = false
		}
		if len(res[s]) > len(d.prompts[s]) {
			d.keep(s, res[s])
		}
	}
}

// Restored is how many passage sequences of the last Begin started from a
// cached prefix (held in the sequence, in memory or on disk).
func (d *Decoder) Restored() int { return d.restored }
