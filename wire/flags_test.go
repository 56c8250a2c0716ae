package wire

import (
	"context"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

func TestRegisterFlags(t *testing.T) {
	var c Config
	f := pflag.NewFlagSet("test", pflag.ContinueOnError)
	c.RegisterFlags(f, "peer-")
	require.NoError(t, f.Parse([]string{
		"--peer-tls-cert=c.pem", "--peer-tls-key=k.pem", "--peer-tls-ca=ca.pem", "--peer-token=s3cret",
		"--peer-keepalive=30s", "--peer-max-message-bytes=1024", "--peer-call-timeout=2s",
	}))
	assert.Equal(t, "c.pem", c.CertFile)
	assert.Equal(t, "k.pem", c.KeyFile)
	assert.Equal(t, "ca.pem", c.CAFile)
	assert.Equal(t, "s3cret", c.Token)
	assert.Equal(t, 30*time.Second, c.Keepalive.Time)
	assert.Equal(t, DefaultKeepaliveTimeout, c.Keepalive.Timeout)
	assert.Equal(t, 1024, c.MaxMessageBytes)
	assert.Equal(t, 2*time.Second, c.CallTimeout)
	assert.False(t, c.Insecure)
}

func TestDeadlineInterceptor(t *testing.T) {
	ic := deadline(50 * time.Millisecond)
	var got time.Time
	invoker := func(ctx context.Context, _ string, _, _ any, _ *grpc.ClientConn, _ ...grpc.CallOption) error {
		got, _ = ctx.Deadline()
		return nil
	}
	start := time.Now()
	require.NoError(t, ic(context.Background(), "/m", nil, nil, nil, invoker))
	assert.WithinDuration(t, start.Add(50*time.Millisecond), got, 40*time.Millisecond, "a call without a deadline gets one")

	own, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	want, _ := own.Deadline()
	require.NoError(t, ic(own, "/m", nil, nil, nil, invoker))
	assert.Equal(t, want, got, "a caller's own deadline is kept")
}
