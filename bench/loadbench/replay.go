package loadbench

import (
	"context"
	"fmt"
	"time"

	"github.com/dragon-rag/dragon/engine"
)

// client is one client's place in the replay.
type client struct {
	jobs    []job
	active  bool
	q       int   // the question of the answer in progress
	fed     []int // prompt tokens of each passage already decoded
	left    int   // tokens still to produce
	prefill bool
}

// Replay decodes the rows of the answers that perClient lists on a fresh
// context of m, with nothing else in the way: each client's answers one
// after another as in the load run, every client's rows (prefills and one
// row per passage per token, logits where a decoder reads them) merged into
// one decode call per step up to the batch size. It returns the answers'
// tokens per second: the most the cloud's batching could deliver.
func Replay(ctx context.Context, m engine.Model, prompts [][][]engine.Token, perClient [][]job, passages, threads int) (float64, error) {
	opts := engine.ContextOptions{MaxSeqs: len(perClient) * passages, CtxPerSeq: 1024, BatchSize: 512, Threads: threads}
	c, err := m.NewContext(opts)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	opts = c.Options()
	clients := make([]*client, len(perClient))
	total := 0
	for i, js := range perClient {
		clients[i] = &client{jobs: js}
		for _, j := range js {
			total += j.tokens
			if len(prompts[j.question]) > passages {
				return 0, fmt.Errorf("question %d has %d prompts for %d passages", j.question, len(prompts[j.question]), passages)
			}
		}
	}
	if total == 0 {
		return 0, nil
	}
	var b engine.Batch
	start := time.Now()
	for {
		b.Reset()
		var decoding []*client
		for ci, cl := range clients {
			if !cl.active {
				if len(cl.jobs) == 0 {
					continue
				}
				j := cl.jobs[0]
				cl.jobs = cl.jobs[1:]
				cl.active, cl.q, cl.left, cl.prefill = true, j.question, j.tokens, true
				cl.fed = make([]int, len(prompts[j.question]))
				for s := range passages {
					if err := c.Truncate(ci*passages+s, 0); err != nil {
						return 0, err
					}
				}
			}
			ps := prompts[cl.q]
			if cl.prefill {
				for s, p := range ps {
					for cl.fed[s] < len(p) && b.Len() < opts.BatchSize {
						k := cl.fed[s]
						b.Add(p[k], k, k == len(p)-1, ci*passages+s)
						cl.fed[s]++
					}
				}
				done := true
				for s, p := range ps {
					done = done && cl.fed[s] == len(p)
				}
				if done {
					cl.prefill = false
					decoding = append(decoding, cl) // the prefill's last rows give the first token
				}
				continue
			}
			if b.Len()+len(ps) > opts.BatchSize {
				continue
			}
			for s, p := range ps {
				b.Add(p[len(p)-1], c.SeqLen(ci*passages+s), true, ci*passages+s)
			}
			decoding = append(decoding, cl)
		}
		if b.Len() == 0 {
			break
		}
		if err := c.Decode(ctx, &b); err != nil {
			return 0, err
		}

		for _, cl := range decoding {
			if cl.left--; cl.left == 0 {
				cl.active = false
			}
		}
	}
	return float64(total) / time.Since(start).Seconds(), nil
}
