// Package aggregator is Speculative Aggregation (DRAGON §4, Algorithm 1)
// and the side scheduler (§5) as pure state machines: events in, actions
// out, no goroutines, clocks, sockets, cgo or gRPC, like etcd's raft core.
//
// Both sides of a generation hold a Node. Each side drafts tokens ahead
// from its own locally-aggregated distribution; the Node on the side that
// currently aggregates pairs the two sides' drafts by step, decides the
// target token of each step with Algorithm 1 and answers with verdicts; the
// Node on the other side forwards its side's drafts and applies verdicts.
// A rejected side bumps its epoch, so its drafts still in flight are
// recognised as stale and never verified. Between two steps the aggregating
// Node may hand the role over with a Handover that carries the next step,
// its own undecided drafts and both epochs: no target token is lost,
// duplicated or reordered.
//
// Exactness (Appendix A.2) needs each draft to be drawn from exactly the
// distribution the aggregator uses for its side. Propose is the one place
// that makes a draft: it encodes the distribution with package codec, draws
// the token from the encoded view, and returns both; the remote side
// decodes the same bytes to the same view. The randomness of drafts and of
// Algorithm 1 is a function of (seed, side, step) alone, so an answer does
// not depend on timing, handovers or which side aggregated.
package aggregator
