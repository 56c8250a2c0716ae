// Package specdec is local speculative decoding for one side's decoder: drafts
// taken from the context itself (sd.npu), made by a suffix automaton over
// the prompt, the retrieved passages, calibrated model predictions, the
// answer so far and earlier answers; lossless verification, greedy or
// sampled, of linear drafts and token trees; and a cost model that decides
// whether and how far to speculate from online acceptance rates and a
// measured verification-cost table (003, Lever).
//
// It is pure: no goroutines, clocks, engine calls or I/O. Callers pass in
// the target's outputs and their own timings, and get back what to emit and
// how many KV positions to roll back.
//
// One linear step of a decoder, with the pending token (the last emitted,
// not yet in the KV cache) at position p:
//
//	dr := drafter.Draft()
//	plan := model.Choose(dr.MatchLen, len(dr.Tokens))
//	draft := dr.Tokens[:plan.Gamma]
//	// decode [pending, draft...] at p, p+1, ...; argmax[i] of row i of the
//	// locally-aggregated distribution (or probs[i] for sampling)
//	v, _ := spec.VerifyGreedy(draft, argmax) // or spec.VerifySample(draft, probs, rng)
//	// remove the last v.Rollback positions of each sequence
//	drafter.Verified(draft, argmax)
//	drafter.Append(v.Emit...) // v.Emit[len-1] is the next pending token
//	model.Observe(plan, specdec.Outcome{Accepted: v.Accepted, Attempted: v.Attempted, ...})
//	stats.Record(len(draft), v.Accepted, dr.MatchLen == spec.MatchReuse)
//
// A tree step replaces the first three lines with
//
//	src := drafter.TreeSource()
//	tree := spec.BuildTree(src, pending, model.TreeCost, opts.TreeBudget, leaves, opts.MaxDraft)
//	plan := model.PlanTree(tree, src.MatchLen)
//
// decodes node i as row i at position p+Depth with the sequence ids of its
// Branches, verifies with tree.VerifyGreedy or tree.VerifySample, keeps the
// sequence of the verdict's Branch, and reports with VerifiedTree.
package specdec
