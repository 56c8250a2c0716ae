package decoder

import (
	"context"
	"fmt"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/specdec"
)

// Token trees (Lever §B2(a)). Passage s decodes branch 0 of a tree on its
// own sequence s and branch b ≥ 1 on a sequence of its own (branchSeq).
// Each sequence is a KV stream of its own (no unified buffer), and a branch
// starts as a whole copy of its passage's stream, so the branch's cells lie
// exactly as the passage's would if it had decoded the branch's path
// itself: a node shared by several branches is decoded once in each, and
// its row is plain decoding's after its path, bit for bit (llama.cpp's
// unified buffer, where branches would share the prefix's cells, sums
// attention over other branches' cells in between and moves logits by up
// to 0.36; DESIGN-NOTES). Under a memory budget a pass costs nearly the
// same for the extra rows, and a stream copy is a memcpy.

// maxTreeLeaves bounds a tree's branches: each is a KV stream of
// CtxPerSeq cells per passage (28 MiB at 1,024 on Qwen2.5-1.5B).
const maxTreeLeaves = 4

// TreeBranches is how many branches a tree may have (1: trees are off).
func (d *Decoder) TreeBranches() int { return d.branches }

// branchSeq is the KV sequence of branch b of passage s.
func (d *Decoder) branchSeq(s, b int) int {
	if b == 0 {
		return s
	}
	return d.opts.MaxPassages + s*(d.branches-1) + b - 1
}

// VerifyTree decodes the pending tokens and every draft node of tree on
// every passage in one batch and returns one mixture per node: rows[i] is
// p^s after node i's path (rows[0]: after the pending tokens, tree.Nodes[0]
// standing for the last of them). Follow it with CommitTree. The rows are
// owned by the decoder until the next Verify or VerifyTree.
func (d *Decoder) VerifyTree(ctx context.Context, tree *specdec.Tree) ([][]float32, error) {
	switch {
	case d.branches <= 1:
		return nil, fmt.Errorf("decoder: %w: token trees are off (Spec.TreeBudget ≤ 1)", engine.ErrInvalidInput)
	case tree == nil || len(tree.Leaves) == 0:
		return nil, fmt.Errorf("decoder: %w: tree without leaves (call Finish)", engine.ErrInvalidInput)
	case len(tree.Leaves) > d.branches:
		return nil, fmt.Errorf("decoder: %w: tree of %d branches, at most %d", engine.ErrInvalidInput, len(tree.Leaves), d.branches)
	}
	if d.ev.on && d.ev.firstMissing(len(d.gen)) >= 0 {
		// A plain pass first gives the answer's tokens their terms (and
		// the root's distribution): tree rows have no term rows.
		if err := d.forward(ctx, nil, false, nil); err != nil {
			return nil, err
		}
	}
	depth := 0
	for _, n := range tree.Nodes {
		depth = max(depth, n.Depth)
	}
	n := len(tree.Nodes)
	d.resetMixes(n)
	d.ev.dropPass()
	pending := len(d.prompts[0]) + len(d.gen) - d.held[0]
	if pending == 0 {
		if !d.nextValid {
			return nil, fmt.Errorf("decoder: internal error: nothing pending and no distribution for the root")
		}
		copy(d.mixes[0], d.next)
	}
	saved := append([]int(nil), d.held...)
	undo := func(err error) error {
		for s := range d.prompts {
			for b := 1; b < len(tree.Leaves); b++ {
				if terr := d.ectx.Truncate(d.branchSeq(s, b), 0); terr != nil {
					return fmt.Errorf("decoder: %w (and clearing a branch: %w)", err, terr)
				}
			}
		}
		return d.undo(saved, err)
	}

	var wants []rowWant
	d.batch.Reset()
	flush := func() (err error) {
		wants, err = d.decodeBatch(ctx, wants, nil)
		return err
	}
	add := func(w rowWant, tok engine.Token, pos int, seq int) error {
		d.batch.Add(tok, pos, w.out >= 0, seq)
		wants = append(wants, w)
		if d.batch.Len() >= d.opts.BatchSize {
			return flush()
		}
		return nil
	}
	for s, prompt := range d.prompts {
		base := len(prompt) + len(d.gen) // position of depth 1
		if base+depth > d.opts.CtxPerSeq {
			return nil, undo(fmt.Errorf("%w: sequence %d would hold %d positions, more than %d", engine.ErrContextFull, s, base+depth, d.opts.CtxPerSeq))
		}
		all := make([]int, len(tree.Leaves))
		for b := range tree.Leaves {
			all[b] = d.branchSeq(s, b)
			if b > 0 {
				if err := d.ectx.CopySeq(s, all[b], 0, d.held[s]); err != nil {
					return nil, undo(err)
				}
			}
		}
		// Pending tokens belong to every branch; the last one is the root.
		// A row decoded in several branches is read from the first.
		for pos := d.held[s]; pos < base; pos++ {
			for b, seq := range all {
				out := -1
				if pos == base-1 && b == 0 {
					out = 0
				}
				if err := add(rowWant{seq: s, out: out, prow: -1}, d.tokenAt(prompt, pos, nil), pos, seq); err != nil {
					return nil, undo(err)
				}
			}
		}
		for i, node := range tree.Nodes[1:] {
			for j, b := range node.Branches {
				out := -1
				if j == 0 {
					out = i + 1
				}
				if err := add(rowWant{seq: s, out: out, prow: -1}, node.Token, base+node.Depth-1, all[b]); err != nil {
					return nil, undo(err)
				}
			}
		}
	}
	if err := flush(); err != nil {
		return nil, undo(err)
	}
	for s, p := range d.prompts {
		d.held[s] = len(p) + len(d.gen) + tree.Nodes[tree.Leaves[0]].Depth
	}
	d.nextValid = false
	return d.mixes[:n], nil
}

// CommitTree records the outcome v of a VerifyTree: the accepted path stays
// in every passage's own sequence, v.Emit joins the answer, and every other
// node is removed, with the branch sequences.
func (d *Decoder) CommitTree(tree *specdec.Tree, v specdec.TreeVerdict) error {
	a := v.Accepted
	if a < 0 || len(v.Path) != a || len(v.Emit) != a+1 || v.Branch < 0 || v.Branch >= len(tree.Leaves) {
		return fmt.Errorf("decoder: %w: tree commit of %d accepted, %d emitted, branch %d of %d", engine.ErrInvalidInput, a, len(v.Emit), v.Branch, len(tree.Leaves))
	}
	for s, p := range d.prompts {
		base := len(p) + len(d.gen)
		keep := base + a
		if v.Branch == 0 {
			if err := d.ectx.Truncate(s, keep); err != nil {
				return fmt.Errorf("decoder: commit tree, sequence %d: %w", s, err)
			}
		} else {
			// The passage's own sequence holds branch 0: the accepted
			// branch's stream, a copy of it with the path after, becomes
			// the passage's whole (no recomputation), cut after the path.
			bseq := d.branchSeq(s, v.Branch)
			err := d.ectx.Truncate(s, 0)
			if err == nil {
				err = d.ectx.CopySeq(bseq, s, 0, base+tree.Nodes[tree.Leaves[v.Branch]].Depth)
			}
			if err == nil {
				err = d.ectx.Truncate(s, keep)
			}
			if err != nil {
				return fmt.Errorf("decoder: commit tree, sequence %d: %w", s, err)
			}
		}
		for b := 1; b < len(tree.Leaves); b++ {
			if err := d.ectx.Truncate(d.branchSeq(s, b), 0); err != nil {
				return fmt.Errorf("decoder: commit tree, branch %d of sequence %d: %w", b, s, err)
			}
		}
		d.held[s] = keep
	}
	if d.ev.on {
		// The distribution at the answer's position base+j is that after
		// the accepted path's node of depth j (the root's for j = 0).
		base := len(d.gen)
		for j := 0; j <= a; j++ {
			node := 0
			if j > 0 {
				node = v.Path[j-1]
			}
			if node < len(d.ev.pass) && d.ev.pass[node] != nil && d.ev.pass[node].filled() {
				dd := d.ev.pass[node]
				d.ev.pass[node], dd.pos = nil, base+j
				d.ev.put(dd)
			}
		}
		d.ev.dropPass()
	}
	d.gen = append(d.gen, v.Emit...)
	d.nextValid = false
	d.bindEvidence()
	return nil
}

// dropTree removes a verified tree's rows from every sequence, leaving the
// answer as it was before VerifyTree.
func (d *Decoder) dropTree(tree *specdec.Tree) error {
	d.ev.dropPass()
	for s, p := range d.prompts {
		base := len(p) + len(d.gen)
		if err := d.ectx.Truncate(s, base); err != nil {
			return fmt.Errorf("decoder: drop tree, sequence %d: %w", s, err)
		}
		for b := 1; b < len(tree.Leaves); b++ {
			if err := d.ectx.Truncate(d.branchSeq(s, b), 0); err != nil {
				return fmt.Errorf("decoder: drop tree, branch %d of sequence %d: %w", b, s, err)
			}
		}
		d.held[s] = base
	}
	return nil
}
