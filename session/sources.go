package session

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/sources"
)

// An answer's sources (Options.Sources). Each side knows its own passages
// and their evidence of the answer (decoder.Evidence); the cloud sends its
// entries to the device once the answer is over (after the device's
// Cancel, which carries the answer's tokens where the cloud saw them
// decided), and the device combines them with its own into the list the
// app gets. The device's entries are made on the device and never cross:
// no message the device sends has a field that could carry them.

// Sources are a side's passages as entries of an answer's sources, with
// their log-likelihoods of the answer where logLik has them (one per
// passage; nil: not known). Weights and shares are left to
// CombineSources.
func Sources(side aggregator.Side, passages []decoder.Passage, logLik []float64) []*dragonv1.Source {
	out := make([]*dragonv1.Source, len(passages))
	for i, p := range passages {
		e := &dragonv1.Source{
			Side: toSide(side), DocumentId: sources.DocumentID(p.Source), PassageId: p.ID, Source: p.Source,
			Title: sources.Title(p.Source, p.Meta), Score: p.Score, Excerpt: sources.Excerpt(p.Text, sources.MaxExcerpt),
			Start: uint64(max(p.Start, 0)), End: uint64(max(p.End, 0)),
		}
		if p.Text == "" && p.Source == ClosedBookSource {
			e.ClosedBook, e.Title, e.DocumentId = true, "the model's own knowledge (closed book)", ""
		}
		if meta := shownMeta(p.Meta); len(meta) > 0 {
			e.Metadata = meta
		}
		if i < len(logLik) && logLik != nil {
			e.LogLikelihood, e.HasEvidence = logLik[i], true
		}
		out[i] = e
	}
	return out
}

// shownMeta is the metadata an entry shows: what tells a person which
// document it is (not the index's bookkeeping, such as an encoding).
func shownMeta(meta map[string]string) map[string]string {
	var out map[string]string
	for _, k := range []string{"from", "date", "page", "author", "url"} {
		if v := meta[k]; v != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// CombineSources sets every entry's weight in the mixture and share of
// the answer, over all of them (both sides' passages), and sorts them
// largest share first. The shares are the posterior given the answer when
// every entry has its evidence; when none has (an answer decoded over all
// passages in one sequence), they are the weights. It reports whether the
// entries were a mix of both, in which case the shares are the weights
// too: no posterior is exact over part of the passages.
func CombineSources(list []*dragonv1.Source) (mixed bool) {
	if len(list) == 0 {
		return false
	}
	scores := make([]float64, len(list))
	logLik := make([]float64, len(list))
	with := 0
	for i, e := range list {
		scores[i], logLik[i] = e.GetScore(), e.GetLogLikelihood()
		if e.GetHasEvidence() {
			with++
		}
	}
	if with < len(list) {
		logLik = nil
	}
	weights, shares := sources.Shares(scores, logLik)
	for i, e := range list {
		if weights != nil {
			e.Weight, e.Share = weights[i], shares[i]
		}
	}
	slices.SortStableFunc(list, func(a, b *dragonv1.Source) int { return cmp.Compare(b.GetShare(), a.GetShare()) })
	return with > 0 && with < len(list)
}

// evidence is this side's log-likelihoods of answer, one per sequence of
// the decoder's generation: the decoder's answer is brought to answer
// first (what it drafted beyond or instead of it is dropped). nil when
// sources are off or the decoder cannot tell.
func evidence(ctx context.Context, opts Options, dec *decoder.Decoder, answer []engine.Token) []float64 {
	if !opts.Sources || !dec.EvidenceOn() {
		return nil
	}
	gen := dec.Generated()
	k := 0
	for k < len(gen) && k < len(answer) && gen[k] == answer[k] {
		k++
	}
	if k < len(gen) || k < len(answer) {
		if err := dec.Rewind(k, answer[k:]...); err != nil {
			opts.Log.Warn("sources: the decoder cannot take the answer", "err", err)
			return nil
		}
	}
	ll, err := dec.Evidence(ctx, len(answer))
	if err != nil {
		opts.Log.Warn("sources: no evidence of the answer", "err", err)
		return nil
	}
	return ll
}

// sourcesMessage is the peer message of this side's entries.
func sourcesMessage(id uint64, list []*dragonv1.Source) *dragonv1.PeerMessage {
	return &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Sources{Sources: &dragonv1.Sources{SessionId: id, Sources: list}}}
}

// answerOf is what a Cancel tells of the answer: its tokens, if they are
// tokens of this vocabulary and no more than the answer could hold.
func answerOf(c *dragonv1.Cancel, vocab, maxTokens int) ([]engine.Token, error) {
	toks := c.GetAnswer()
	if len(toks) > maxTokens+1 {
		return nil, fmt.Errorf("%w: an answer of %d tokens for at most %d", aggregator.ErrProtocol, len(toks), maxTokens)
	}
	for _, t := range toks {
		if t < 0 || int(t) >= vocab {
			return nil, fmt.Errorf("%w: answer token %d outside the vocabulary", aggregator.ErrProtocol, t)
		}
	}
	return toks, nil
}

// peerSources are this side's entries as the peer gets them after the
// answer: with their evidence of answer when the decoder holds this
// generation's sequences of passages (decoded is false for a side that
// only prefilled or sent its passages).
func peerSources(ctx context.Context, opts Options, dec *decoder.Decoder, passages []decoder.Passage, answer []engine.Token, decoded bool) []*dragonv1.Source {
	var ll []float64
	if decoded && len(answer) > 0 && len(passages) > 0 && dec.Seqs() == len(passages) {
		ll = evidence(ctx, opts, dec, answer)
	}
	return Sources(opts.Self, passages, ll)
}

// awaitSources waits, after the Cancel, for the peer's Sources: other
// messages still in flight are dropped. It gives up when the stream ends,
// when ctx is done or after wait.
func awaitSources(ctx context.Context, in <-chan inbound, wait time.Duration) ([]*dragonv1.Source, uint64, bool) {
	timeout := time.NewTimer(wait)
	defer timeout.Stop()
	var received uint64
	for {
		select {
		case m := <-in:
			if m.err != nil {
				return nil, received, false
			}
			received += uint64(proto.Size(m.msg))
			if e := m.msg.GetError(); e != nil {
				return nil, received, false
			}
			if s := m.msg.GetSources(); s != nil {
				if err := checkPeerSources(s.GetSources()); err != nil {
					slog.Warn("sources: the cloud's are not usable", "err", err)
					return nil, received, false
				}
				return s.GetSources(), received, true
			}
		case <-timeout.C:
			return nil, received, false
		case <-ctx.Done():
			return nil, received, false
		}
	}
}

// Bounds on a peer's entries: no more than a request's passages and the
// closed-book document could make, and strings of what a person reads.
const (
	maxPeerSources = 2 * maxPassagesPerSide
	maxSourceText  = 4 << 10
	maxSourceMeta  = 16
)

// maxPassagesPerSide is the most passages a daemon lets a request ask of
// a side (the decoder's sequences are bounded by llama.cpp's 256).
const maxPassagesPerSide = 256

// checkPeerSources refuses entries a peer made up: too many, of the wrong
// side, numbers that are no relevance or log-likelihood, or text beyond
// what an entry shows.
func checkPeerSources(list []*dragonv1.Source) error {
	if len(list) > maxPeerSources {
		return fmt.Errorf("%w: %d sources", aggregator.ErrProtocol, len(list))
	}
	for i, e := range list {
		switch {
		case e.GetSide() != dragonv1.Side_SIDE_CLOUD:
			return fmt.Errorf("%w: source %d of side %v", aggregator.ErrProtocol, i, e.GetSide())
		case math.IsNaN(e.GetScore()) || math.IsInf(e.GetScore(), 1):
			return fmt.Errorf("%w: source %d of relevance %v", aggregator.ErrProtocol, i, e.GetScore())
		case e.GetHasEvidence() && (math.IsNaN(e.GetLogLikelihood()) || e.GetLogLikelihood() > 1e-6):
			return fmt.Errorf("%w: source %d of log-likelihood %v", aggregator.ErrProtocol, i, e.GetLogLikelihood())
		case utf8.RuneCountInString(e.GetExcerpt()) > sources.MaxExcerpt:
			return fmt.Errorf("%w: source %d has an excerpt of %d characters", aggregator.ErrProtocol, i, utf8.RuneCountInString(e.GetExcerpt()))
		case len(e.GetSource()) > maxSourceText || len(e.GetTitle()) > maxSourceText || len(e.GetDocumentId()) > maxSourceText:
			return fmt.Errorf("%w: source %d has a name or title of more than %d bytes", aggregator.ErrProtocol, i, maxSourceText)
		case len(e.GetMetadata()) > maxSourceMeta:
			return fmt.Errorf("%w: source %d has %d metadata entries", aggregator.ErrProtocol, i, len(e.GetMetadata()))
		}
		for k, v := range e.GetMetadata() {
			if len(k)+len(v) > maxSourceText {
				return fmt.Errorf("%w: source %d has metadata %q of %d bytes", aggregator.ErrProtocol, i, k, len(v))
			}
		}
	}
	return nil
}
