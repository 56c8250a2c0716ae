package session

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/wire"
)

// Conn is one side's end of the peer stream, as both gRPC stream ends
// provide it. One goroutine may Send while another Recvs.
type Conn interface {
	Send(*dragonv1.PeerMessage) error
	Recv() (*dragonv1.PeerMessage, error)
}

// Pipe returns the two ends of an in-memory peer stream (tests): messages
// arrive in order; Close on either end makes the other's Recv return
// io.EOF once it has read what was sent.
func Pipe() (a, b *PipeEnd) {
	ab, ba := make(chan *dragonv1.PeerMessage, 1024), make(chan *dragonv1.PeerMessage, 1024)
	done := make(chan struct{})
	var once sync.Once
	closeAll := func() { once.Do(func() { close(done) }) }
	return &PipeEnd{in: ba, out: ab, done: done, close: closeAll}, &PipeEnd{in: ab, out: ba, done: done, close: closeAll}
}

// PipeEnd is one end of a Pipe.
type PipeEnd struct {
	in, out chan *dragonv1.PeerMessage
	done    chan struct{}
	close   func()
}

// Send implements Conn.
func (p *PipeEnd) Send(m *dragonv1.PeerMessage) error {
	select {
	case <-p.done:
		return io.ErrClosedPipe
	case p.out <- m:
		return nil
	}
}

// Recv implements Conn.
func (p *PipeEnd) Recv() (*dragonv1.PeerMessage, error) {
	select {
	case m := <-p.in:
		return m, nil
	case <-p.done:
		select {
		case m := <-p.in:
			return m, nil
		default:
			return nil, io.EOF
		}
	}
}

// Close ends the pipe for both ends.
func (p *PipeEnd) Close() { p.close() }

// NewHello is the Hello of side, with its decoding fit when it has one.
func NewHello(info engine.ModelInfo, side aggregator.Side, fit profiler.DecodeFit) *dragonv1.Hello {
	h := wire.NewHello(info, toSide(side))
	if fit.Valid() {
		h.DecodeFit = &dragonv1.DecodeFit{KA: fit.Ka, KB: fit.Kb, KC: fit.Kc}
	}
	return h
}

// FitFromHello is the decoding fit a peer sent at handshake (invalid when
// it sent none).
func FitFromHello(h *dragonv1.Hello) profiler.DecodeFit {
	f := h.GetDecodeFit()
	return profiler.DecodeFit{Ka: f.GetKA(), Kb: f.GetKB(), Kc: f.GetKC()}
}

// Handshake exchanges Hellos: ours goes first, then the peer's is checked
// (protocol version, model fingerprint, sides). An incompatible peer is
// told why with an Error message before the error is returned.
func Handshake(ctx context.Context, c Conn, ours *dragonv1.Hello) (*dragonv1.Hello, error) {
	if err := SendHello(c, ours); err != nil {
		return nil, err
	}
	return AwaitHello(ctx, c, ours)
}

// SendHello is the first half of Handshake, for a side that sends more
// before the peer's Hello comes back (the device pipelines its Begin).
func SendHello(c Conn, ours *dragonv1.Hello) error {
	if err := Send(c, &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Hello{Hello: ours}}); err != nil {
		return fmt.Errorf("handshake: send hello: %w", err)
	}
	return nil
}

// Send sends m. When the peer has already ended the stream (it refused our
// token or our Hello, say), gRPC's Send says only io.EOF: why is in the
// status Recv returns, so that is the error.
func Send(c Conn, m *dragonv1.PeerMessage) error {
	err := c.Send(m)
	if !errors.Is(err, io.EOF) {
		return err
	}
	// What the peer sent before it ended the stream can no longer be acted
	// on, except its account of why.
	for {
		got, rerr := c.Recv()
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return err
			}
			return rerr
		}
		if e := got.GetError(); e != nil {
			return status.Error(codes.Code(e.GetCode()), e.GetMessage())
		}
	}
}

// AwaitHello is the second half of Handshake: it receives the peer's Hello
// and checks it against ours.
func AwaitHello(ctx context.Context, c Conn, ours *dragonv1.Hello) (*dragonv1.Hello, error) {
	type result struct {
		m   *dragonv1.PeerMessage
		err error
	}
	got := make(chan result, 1)
	go func() {
		m, err := c.Recv()
		got <- result{m, err}
	}()
	var r result
	select {
	case <-ctx.Done():
		// A Hello that came with the cancel is still read: a peer that
		// hangs up on ours should hear why it was refused.
		select {
		case r = <-got:
		default:
			return nil, fmt.Errorf("handshake: %w", ctx.Err())
		}
	case r = <-got:
	}
	if r.err != nil {
		return nil, fmt.Errorf("handshake: %w", r.err)
	}
	if e := r.m.GetError(); e != nil {
		return nil, status.Error(codes.Code(e.GetCode()), e.GetMessage())
	}
	peer := r.m.GetHello()
	if err := wire.CheckHello(ours, peer); err != nil {
		_ = c.Send(errorMessage(0, err))
		return nil, err
	}
	return peer, nil
}

// errorMessage tells the peer why this side gives up.
func errorMessage(id uint64, err error) *dragonv1.PeerMessage {
	st, ok := status.FromError(err)
	if !ok {
		st = status.New(codes.Internal, err.Error())
		switch {
		case errors.Is(err, context.Canceled):
			st = status.New(codes.Canceled, err.Error())
		case errors.Is(err, context.DeadlineExceeded):
			st = status.New(codes.DeadlineExceeded, err.Error())
		}
	}
	return &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Error{Error: &dragonv1.Error{
		SessionId: id, Code: uint32(st.Code()), Message: st.Message(),
	}}}
}
