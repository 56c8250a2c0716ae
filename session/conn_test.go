package session

import (
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// endedConn is a stream the peer already ended: Send reports io.EOF, as
// gRPC does, and Recv the status the peer ended it with.
type endedConn struct{ recvErr error }

func (endedConn) Send(*dragonv1.PeerMessage) error       { return io.EOF }
func (c endedConn) Recv() (*dragonv1.PeerMessage, error) { return nil, c.recvErr }

func TestHandshakeOnAnEndedStreamReportsWhy(t *testing.T) {
	for name, tc := range map[string]struct {
		recvErr error
		want    codes.Code
	}{
		"refused":       {status.Error(codes.Unauthenticated, "invalid bearer token"), codes.Unauthenticated},
		"ended cleanly": {io.EOF, codes.Unknown},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Handshake(context.Background(), endedConn{tc.recvErr}, &dragonv1.Hello{})
			assert.Error(t, err)
			assert.Equal(t, tc.want, status.Code(err))
			if tc.want == codes.Unknown {
				assert.ErrorIs(t, err, io.EOF)
			}
		})
	}
}

// queuedConn is a stream the peer ended after sending msgs.
type queuedConn struct {
	msgs    []*dragonv1.PeerMessage
	recvErr error
}

func (*queuedConn) Send(*dragonv1.PeerMessage) error { return io.EOF }
func (c *queuedConn) Recv() (*dragonv1.PeerMessage, error) {
	if len(c.msgs) == 0 {
		return nil, c.recvErr
	}
	m := c.msgs[0]
	c.msgs = c.msgs[1:]
	return m, nil
}

// TestSendOnAnEndedStreamReportsWhy: the cloud refuses a Hello after
// sending its own, and the device's Begin, sent before the refusal came,
// then fails with the refusal's reason, not with gRPC's bare io.EOF.
func TestSendOnAnEndedStreamReportsWhy(t *testing.T) {
	hello := &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Hello{Hello: &dragonv1.Hello{}}}
	refusal := errorMessage(0, status.Error(codes.FailedPrecondition, "model mismatch: different tokenizers"))
	for name, tc := range map[string]struct {
		conn *queuedConn
		want codes.Code
		msg  string
	}{
		"error message, then status": {&queuedConn{[]*dragonv1.PeerMessage{hello, refusal}, status.Error(codes.FailedPrecondition, "model mismatch: different tokenizers")}, codes.FailedPrecondition, "different tokenizers"},
		"status only":                {&queuedConn{[]*dragonv1.PeerMessage{hello}, status.Error(codes.Unauthenticated, "invalid bearer token")}, codes.Unauthenticated, "bearer"},
		"ended cleanly":              {&queuedConn{[]*dragonv1.PeerMessage{hello}, io.EOF}, codes.Unknown, "EOF"},
	} {
		t.Run(name, func(t *testing.T) {
			err := Send(tc.conn, &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Begin{Begin: &dragonv1.Begin{}}})
			assert.Equal(t, tc.want, status.Code(err))
			assert.ErrorContains(t, err, tc.msg)
		})
	}
}
