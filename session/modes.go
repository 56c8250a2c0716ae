package session

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// The baselines that synchronise less than Run does: sequence-wise
// aggregation (DRDG/SW), the cloud alone, and the cloud's passages fetched
// as text (DRCG/Text). Each has a device half (which owns the request) and
// a cloud half.

// errStop ends a local generation early without an error.
var errStop = errors.New("stop")

// messages forwards conn's messages to a channel until the stream ends or
// ctx is done; the last value carries the error that ended it.
func messages(ctx context.Context, conn Conn) <-chan inbound {
	ch := make(chan inbound, 16)
	go func() {
		for {
			m, err := conn.Recv()
			select {
			case ch <- inbound{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

// peerError is the status of an Error message the peer sent.
func peerError(e *dragonv1.Error) error {
	return status.Errorf(codes.Code(e.GetCode()), "peer: %s", e.GetMessage())
}

// expect waits for the next message and checks it is not an error.
func expect(ctx context.Context, in <-chan inbound) (*dragonv1.PeerMessage, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case m := <-in:
		if m.err != nil {
			return nil, m.err
		}
		if e := m.msg.GetError(); e != nil {
			return nil, peerError(e)
		}
		return m.msg, nil
	}
}

// awaitCancel waits for the device to end the session: its Cancel, or
// nil when the stream ends without one.
func awaitCancel(ctx context.Context, in <-chan inbound) (*dragonv1.Cancel, error) {
	for {
		m, err := expect(ctx, in)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, nil
			}
			return nil, err
		}
		if c := m.GetCancel(); c != nil {
			return c, nil
		}
	}
}

// finishServing ends a cloud half: it waits for the device's Cancel and,
// when the request asked for sources, answers it with this side's
// entries, with their evidence of the answer the Cancel carries when
// decoded says that the decoder decoded this generation over passages.
func finishServing(ctx context.Context, opts Options, dec *decoder.Decoder, passages []decoder.Passage, in <-chan inbound, conn Conn, decoded bool) error {
	c, err := awaitCancel(ctx, in)
	if err != nil || c == nil {
		return err
	}
	return sendSources(ctx, opts, dec, passages, c, conn, decoded)
}

// sendSources answers the device's Cancel c with this side's entries
// when the request asked for them.
func sendSources(ctx context.Context, opts Options, dec *decoder.Decoder, passages []decoder.Passage, c *dragonv1.Cancel, conn Conn, decoded bool) error {
	if !opts.Sources || c == nil {
		return nil
	}
	answer, err := answerOf(c, dec.Model().Info().VocabSize, opts.MaxTokens)
	if err != nil {
		opts.Log.Warn("sources: the device's answer is not one", "err", err)
	}
	return conn.Send(sourcesMessage(opts.SessionID, peerSources(ctx, opts, dec, passages, answer, decoded)))
}

// cancelMessage is the device's last message of a session: the Cancel,
// with the answer's tokens when the request asked for sources and the
// cloud saw the answer decided (answer; nil where it must not cross).
func cancelMessage(opts Options, finish Finish, answer []engine.Token) *dragonv1.PeerMessage {
	c := &dragonv1.Cancel{SessionId: opts.SessionID, Reason: string(finish)}
	if opts.Sources {
		c.Answer = answer
	}
	return &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Cancel{Cancel: c}}
}

// peerSourcesAfter waits for the cloud's entries after the device's
// Cancel, when the request asked for sources, into sum.
func peerSourcesAfter(ctx context.Context, opts Options, in <-chan inbound, sum *Summary) {
	if !opts.Sources {
		return
	}
	var n uint64
	var ok bool
	sum.PeerSources, n, ok = awaitSources(ctx, in, cmp.Or(opts.StallTimeout, defaultStallTimeout))
	sum.BytesReceived += n
	sum.PeerSourcesMissing = !ok
}

// sendCounted sends m and adds its size to *n.
func sendCounted(conn Conn, m *dragonv1.PeerMessage, n *uint64) error {
	if err := conn.Send(m); err != nil {
		return err
	}
	*n += uint64(proto.Size(m))
	return nil
}

// FinishFetched ends a baseline whose answer the device decoded alone over
// what it fetched (context, KV): the Cancel, without the answer, then the
// cloud's entries when the request asked for sources.
func FinishFetched(ctx context.Context, opts Options, conn Conn, inbox *Inbox, sum *Summary) {
	if err := sendCounted(conn, cancelMessage(opts, sum.Finish, nil), &sum.BytesSent); err == nil && ctx.Err() == nil {
		peerSourcesAfter(ctx, opts, inbox.in, sum)
	}
}

// Input is what a local generation decodes.
type Input struct {
	Query    string
	Passages []decoder.Passage
	// Context concatenates the passages into one prompt (DRCG/Text).
	Context bool
	// Imported are sequences the cloud prefilled (DRCG/KV).
	Imported []decoder.Imported
}

// Local runs a generation on this side alone (device-only, and the device
// half of the context and KV baselines): decoder.Generate with emit.
func Local(ctx context.Context, opts Options, dec *decoder.Decoder, in Input, emit Emit) (Summary, error) {
	if err := opts.defaults(); err != nil {
		return Summary{}, err
	}
	var sum Summary
	res, err := dec.Generate(ctx, decoder.Request{
		Query: in.Query, Passages: in.Passages, Sampling: opts.Sampling, MaxTokens: opts.MaxTokens, Context: in.Context, Imported: in.Imported,
	}, func(tok engine.Token, _ string) error {
		sum.TokenTimes = append(sum.TokenTimes, time.Now())
		if emit != nil {
			stop, err := emit(len(sum.Tokens), tok)
			sum.Tokens = append(sum.Tokens, tok)
			if err == nil && stop {
				err = errStop
			}
			return err
		}
		sum.Tokens = append(sum.Tokens, tok)
		return nil
	})
	sum.ForwardPasses, sum.LocalAccepted = res.Steps, res.Spec.AcceptedTokens
	sum.Restored[opts.Self.Index()] = dec.Restored()
	if opts.Owner && !in.Context && (err == nil || errors.Is(err, errStop)) {
		// One sequence per passage, own then imported: each one's evidence.
		sum.Evidence = evidence(ctx, opts, dec, dec.Generated())
	}
	switch {
	case errors.Is(err, errStop):
		sum.Finish, err = FinishStop, nil
	case err != nil:
		sum.Finish = FinishCancelled
	default:
		sum.Finish = finishOf(res.Stopped)
	}
	return sum, err
}

func finishOf(stopped string) Finish {
	switch stopped {
	case "eog":
		return FinishEOG
	case "stop":
		return FinishStop
	case "context":
		return FinishContext
	}
	return FinishMaxTokens
}

// ServePassages is the cloud half of the context baseline: it sends its
// passages as text and waits for the device to finish.
func ServePassages(ctx context.Context, opts Options, dec *decoder.Decoder, passages []decoder.Passage, conn Conn) error {
	ps := make([]*dragonv1.Passage, len(passages))
	for i, p := range passages {
		ps[i] = &dragonv1.Passage{Text: p.Text, Score: p.Score, Source: p.Source}
	}
	in := messages(ctx, conn)
	if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Passages{Passages: &dragonv1.Passages{SessionId: opts.SessionID, Passages: ps}}}); err != nil {
		return err
	}
	return finishServing(ctx, opts, dec, passages, in, conn, false)
}

// Inbox is the messages of a peer stream as one goroutine reads them:
// whoever goes on reading the stream after a Fetch reads from the same
// Inbox.
type Inbox struct{ in <-chan inbound }

// NewInbox starts reading conn's messages until the stream ends or ctx is
// done.
func NewInbox(ctx context.Context, conn Conn) *Inbox { return &Inbox{messages(ctx, conn)} }

// FetchPassages is the device half of the context baseline: the cloud's
// passages, as text.
func FetchPassages(ctx context.Context, inbox *Inbox) ([]decoder.Passage, uint64, error) {
	in := inbox.in
	m, err := expect(ctx, in)
	if err != nil {
		return nil, 0, err
	}
	ps := m.GetPassages()
	if ps == nil {
		return nil, 0, fmt.Errorf("%w: expected the cloud's passages, got %T", aggregator.ErrProtocol, m.GetKind())
	}
	out := make([]decoder.Passage, len(ps.GetPassages()))
	for i, p := range ps.GetPassages() {
		out[i] = decoder.Passage{Text: p.GetText(), Score: p.GetScore(), Source: p.GetSource()}
	}
	return out, uint64(proto.Size(m)), nil
}

// ServeSolo is the cloud half of cloud-only generation: it generates alone
// and streams the tokens, until done or the device cancels.
func ServeSolo(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage, conn Conn) error {
	gen, stop := context.WithCancel(ctx)
	defer stop()
	in := messages(ctx, conn)
	cancels := make(chan *dragonv1.Cancel, 1)
	go func() {
		c, _ := awaitCancel(ctx, in)
		cancels <- c
		stop() // the device has what it needs
	}()
	step := uint64(0)
	_, err := Local(gen, opts, dec, Input{Query: query, Passages: passages}, func(_ int, tok engine.Token) (bool, error) {
		m := &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Tokens{Tokens: &dragonv1.Tokens{
			SessionId: opts.SessionID, Step: step, Tokens: []int32{tok}, PassagesRestored: uint32(dec.Restored()),
		}}}
		step++
		return false, conn.Send(m)
	})
	if gen.Err() == nil {
		if err != nil {
			return err
		}
		if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Tokens{Tokens: &dragonv1.Tokens{SessionId: opts.SessionID, Step: step, Done: true}}}); err != nil {
			return err
		}
	}
	var c *dragonv1.Cancel
	select {
	case c = <-cancels:
	case <-ctx.Done():
		return nil
	}
	if c != nil && opts.Sources {
		// The tokens streamed leave the end token out: the answer's is the
		// cloud's own where the device's ends just before it.
		own := dec.Generated()
		if n := len(c.GetAnswer()); n < len(own) && dec.Model().IsEOG(own[n]) && slices.Equal(c.GetAnswer(), own[:n]) {
			c.Answer = own[:n+1]
		}
	}
	return sendSources(ctx, opts, dec, passages, c, conn, true)
}

// ReceiveSolo is the device half of cloud-only generation.
// The Cancel and the sources that follow it go into the named result
// after the answer's last return.
func ReceiveSolo(ctx context.Context, opts Options, conn Conn, emit Emit) (sum Summary, _ error) {
	if err := opts.defaults(); err != nil {
		return Summary{}, err
	}
	in := messages(ctx, conn)
	defer func() {
		if sendCounted(conn, cancelMessage(opts, sum.Finish, sum.Tokens), &sum.BytesSent) == nil && ctx.Err() == nil {
			peerSourcesAfter(ctx, opts, in, &sum)
		}
	}()
	for {
		m, err := expect(ctx, in)
		if err != nil {
			sum.Finish = FinishCancelled
			return sum, err
		}
		sum.BytesReceived += uint64(proto.Size(m))
		toks := m.GetTokens()
		if toks == nil {
			continue // pings and the like
		}
		sum.Restored[aggregator.Cloud.Index()] = max(sum.Restored[aggregator.Cloud.Index()], int(toks.GetPassagesRestored()))
		if toks.GetStep() != uint64(len(sum.Tokens)) {
			return sum, fmt.Errorf("%w: cloud tokens from step %d, expected %d", aggregator.ErrProtocol, toks.GetStep(), len(sum.Tokens))
		}
		for _, tok := range toks.GetTokens() {
			sum.Tokens = append(sum.Tokens, tok)
			sum.TokenTimes = append(sum.TokenTimes, time.Now())
			if emit != nil {
				stop, err := emit(len(sum.Tokens)-1, tok)
				if err != nil {
					return sum, err
				}
				if stop {
					sum.Finish = FinishStop
					return sum, nil
				}
			}
		}
		if toks.GetDone() {
			sum.Finish = FinishEOG
			if len(sum.Tokens) >= opts.MaxTokens {
				sum.Finish = FinishMaxTokens
			}
			return sum, nil
		}
	}
}

// candidate generates this side's whole answer and scores it.
type candidate struct {
	tokens []int32 // the end token last when the answer ended with it
	hTilde float64
}

// generateCandidate is one side's answer alone, the end token included
// when the answer ended with it.
func generateCandidate(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage) (candidate, Summary, error) {
	sum, err := Local(ctx, opts, dec, Input{Query: query, Passages: passages}, nil)
	if err != nil {
		return candidate{}, sum, err
	}
	c := candidate{tokens: append([]int32(nil), sum.Tokens...), hTilde: dec.HTilde()}
	if sum.Finish == FinishEOG {
		c.tokens = append(c.tokens, eogToken(dec.Model()))
	}
	return c, sum, nil
}

// eogToken is the model's end-of-generation token.
func eogToken(m engine.Model) int32 {
	for t := range m.Info().VocabSize {
		if m.IsEOG(engine.Token(t)) {
			return int32(t)
		}
	}
	return 0
}

// score is this side's mixture probability of every token of toks, each
// given the ones before it, in one batched pass over the passages of the
// generation the decoder holds.
func score(ctx context.Context, dec *decoder.Decoder, toks []int32) ([]float64, error) {
	if err := dec.Rewind(0); err != nil {
		return nil, err
	}
	if len(toks) == 0 {
		return nil, nil
	}
	rows, err := dec.Verify(ctx, toks)
	if err != nil {
		return nil, err
	}
	out := make([]float64, len(toks))
	for i, t := range toks {
		out[i] = float64(rows[i][t])
	}
	return out, dec.Rewind(0)
}

// logLikelihood is Σ_t log(η^d·p^d_t + η^c·p^c_t): a candidate's
// likelihood under the mixture of both sides (REPLUG's token-level
// aggregation, here over a whole sequence).
func logLikelihood(pd, pc []float64, etaD, etaC float64) float64 {
	var ll float64
	for i := range pd {
		ll += math.Log(max(etaD*pd[i]+etaC*pc[i], 1e-300))
	}
	return ll
}

// ServeSequenceWise is the cloud half of DRDG/SW: generate a candidate,
// exchange candidates, score both under the cloud's passages and send the
// scores; the device decides.
func ServeSequenceWise(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage, conn Conn) error {
	in := messages(ctx, conn)
	own, _, err := generateCandidate(ctx, opts, dec, query, passages)
	if err != nil {
		return err
	}
	if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Candidate{Candidate: &dragonv1.Candidate{
		SessionId: opts.SessionID, Side: dragonv1.Side_SIDE_CLOUD, Tokens: own.tokens, LogRelevanceMass: own.hTilde,
	}}}); err != nil {
		return err
	}
	peer, err := receiveCandidate(ctx, in, dragonv1.Side_SIDE_DEVICE, dec.Model().Info().VocabSize)
	if err != nil {
		return err
	}
	pDev, err := score(ctx, dec, peer.tokens)
	if err != nil {
		return err
	}
	pCld, err := score(ctx, dec, own.tokens)
	if err != nil {
		return err
	}
	if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Scores{Scores: &dragonv1.CandidateScores{
		SessionId: opts.SessionID, DeviceCandidate: pDev, CloudCandidate: pCld,
	}}}); err != nil {
		return err
	}
	return finishServing(ctx, opts, dec, passages, in, conn, true)
}

func receiveCandidate(ctx context.Context, in <-chan inbound, from dragonv1.Side, vocab int) (candidate, error) {
	for {
		m, err := expect(ctx, in)
		if err != nil {
			return candidate{}, err
		}
		c := m.GetCandidate()
		if c == nil {
			continue
		}
		if c.GetSide() != from {
			return candidate{}, fmt.Errorf("%w: candidate from %v, expected %v", aggregator.ErrProtocol, c.GetSide(), from)
		}
		for _, t := range c.GetTokens() {
			if t < 0 || int(t) >= vocab {
				return candidate{}, fmt.Errorf("%w: candidate token %d outside the vocabulary", aggregator.ErrProtocol, t)
			}
		}
		if h := c.GetLogRelevanceMass(); math.IsNaN(h) || math.IsInf(h, 1) {
			return candidate{}, fmt.Errorf("%w: candidate relevance mass %v", aggregator.ErrProtocol, h)
		}
		return candidate{tokens: c.GetTokens(), hTilde: c.GetLogRelevanceMass()}, nil
	}
}

// SequenceWise is the device half of DRDG/SW: both sides generate a
// candidate alone, the candidates cross once, each side scores both under
// its own passages, and the candidate with the higher likelihood under the
// η-mixture of the two sides is the answer, emitted at once.
func SequenceWise(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage, conn Conn, emit Emit) (sum Summary, _ error) {
	if err := opts.defaults(); err != nil {
		return Summary{}, err
	}
	in := messages(ctx, conn)
	var answer []int32 // the candidate taken, the end token included
	defer func() {
		if sendCounted(conn, cancelMessage(opts, sum.Finish, answer), &sum.BytesSent) == nil && answer != nil && ctx.Err() == nil {
			sum.Evidence = evidence(ctx, opts, dec, answer)
			peerSourcesAfter(ctx, opts, in, &sum)
		}
	}()
	own, local, err := generateCandidate(ctx, opts, dec, query, passages)
	sum.ForwardPasses, sum.LocalAccepted = local.ForwardPasses, local.LocalAccepted
	if err != nil {
		return sum, err
	}
	if len(local.TokenTimes) > 0 {
		sum.FirstLocal = local.TokenTimes[0]
	}
	if err := sendCounted(conn, &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Candidate{Candidate: &dragonv1.Candidate{
		SessionId: opts.SessionID, Side: dragonv1.Side_SIDE_DEVICE, Tokens: own.tokens, LogRelevanceMass: own.hTilde,
	}}}, &sum.BytesSent); err != nil {
		return sum, err
	}
	peer, err := receiveCandidate(ctx, in, dragonv1.Side_SIDE_CLOUD, dec.Model().Info().VocabSize)
	if err != nil {
		return sum, err
	}
	dOwn, err := score(ctx, dec, own.tokens)
	if err != nil {
		return sum, err
	}
	dPeer, err := score(ctx, dec, peer.tokens)
	if err != nil {
		return sum, err
	}
	var scores *dragonv1.CandidateScores
	for scores == nil {
		m, err := expect(ctx, in)
		if err != nil {
			return sum, err
		}
		sum.BytesReceived += uint64(proto.Size(m))
		scores = m.GetScores()
	}
	if len(scores.GetDeviceCandidate()) != len(own.tokens) || len(scores.GetCloudCandidate()) != len(peer.tokens) {
		return sum, fmt.Errorf("%w: the cloud scored %d and %d tokens of candidates of %d and %d", aggregator.ErrProtocol,
			len(scores.GetDeviceCandidate()), len(scores.GetCloudCandidate()), len(own.tokens), len(peer.tokens))
	}
	etaD, etaC := aggregator.Weights(own.hTilde, peer.hTilde)
	taken := own.tokens
	if logLikelihood(dPeer, scores.GetCloudCandidate(), etaD, etaC) > logLikelihood(dOwn, scores.GetDeviceCandidate(), etaD, etaC) {
		taken = peer.tokens
		sum.Aggregated[aggregator.Cloud.Index()] = 1
	} else {
		sum.Aggregated[aggregator.Device.Index()] = 1
	}
	sum.Finish = FinishMaxTokens
	for i, tok := range taken {
		answer = taken[:i+1]
		if dec.Model().IsEOG(tok) {
			sum.Finish = FinishEOG
			break
		}
		sum.Tokens = append(sum.Tokens, tok)
		sum.TokenTimes = append(sum.TokenTimes, time.Now())
		if emit != nil {
			stop, err := emit(i, tok)
			if err != nil {
				return sum, err
			}
			if stop {
				sum.Finish = FinishStop
				break
			}
		}
	}
	return sum, nil
}

// kvChunkBytes bounds the state bytes of one KVChunk message.
const kvChunkBytes = 1 << 20

// ServeKV is the cloud half of DRCG/KV: prefill the cloud's passages and
// ship each sequence's KV state with its prompt and score, then wait for
// the device to finish.
func ServeKV(ctx context.Context, opts Options, dec *decoder.Decoder, query string, passages []decoder.Passage, conn Conn) error {
	in := messages(ctx, conn)
	if len(passages) > 0 {
		if err := dec.Begin(ctx, query, passages, nil); err != nil {
			return err
		}
	}
	for i, p := range passages {
		state, err := dec.SeqState(i)
		if err != nil {
			return err
		}
		prompt := dec.Prompt(i)
		for off := 0; off == 0 || off < len(state); off += kvChunkBytes {
			end := min(off+kvChunkBytes, len(state))
			c := &dragonv1.KVChunk{SessionId: opts.SessionID, Passage: uint32(i), Data: state[off:end], Last: end == len(state), Passages: uint32(len(passages))}
			if off == 0 {
				c.Score, c.Prompt = p.Score, prompt
			}
			if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Kv{Kv: c}}); err != nil {
				return err
			}
		}
	}
	if len(passages) == 0 {
		if err := conn.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Kv{Kv: &dragonv1.KVChunk{SessionId: opts.SessionID, Last: true}}}); err != nil {
			return err
		}
	}
	// The device decodes these passages and knows their evidence.
	return finishServing(ctx, opts, dec, passages, in, conn, false)
}

// FetchKV is the device half of DRCG/KV: the cloud's prefilled passage
// sequences, to import into the device's decoder. It returns them and the
// bytes received.
func FetchKV(ctx context.Context, inbox *Inbox, vocab int) ([]decoder.Imported, uint64, error) {
	in := inbox.in
	var (
		out   []decoder.Imported
		total = -1
		open  bool // the last passage still expects chunks
		bytes uint64
	)
	for {
		m, err := expect(ctx, in)
		if err != nil {
			return nil, bytes, err
		}
		bytes += uint64(proto.Size(m))
		c := m.GetKv()
		if c == nil {
			continue
		}
		if total < 0 {
			if total = int(c.GetPassages()); total == 0 {
				return nil, bytes, nil
			}
		}
		i := int(c.GetPassage())
		switch {
		case !open && i == len(out) && i < total:
			for _, t := range c.GetPrompt() {
				if t < 0 || int(t) >= vocab {
					return nil, bytes, fmt.Errorf("%w: KV prompt token %d outside the vocabulary", aggregator.ErrProtocol, t)
				}
			}
			out = append(out, decoder.Imported{Prompt: c.GetPrompt(), Score: c.GetScore()})
			open = true
		case !open || i != len(out)-1:
			return nil, bytes, fmt.Errorf("%w: KV chunk of passage %d out of order", aggregator.ErrProtocol, i)
		}
		out[i].State = append(out[i].State, c.GetData()...)
		if c.GetLast() {
			if len(out[i].State) == 0 {
				return nil, bytes, fmt.Errorf("%w: empty KV state of passage %d", aggregator.ErrProtocol, i)
			}
			open = false
			if i == total-1 {
				return out, bytes, nil
			}
		}
	}
}
