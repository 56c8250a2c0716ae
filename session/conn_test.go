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
