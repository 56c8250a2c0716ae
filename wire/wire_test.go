package wire_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/wire"
)

// TestMain fails the package if a test leaves gRPC goroutines behind.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if leaks := waitForLeaks(5 * time.Second); leaks != "" {
			fmt.Fprintf(os.Stderr, "goroutines leaked:\n%s\n", leaks)
			code = 1
		}
	}
	os.Exit(code)
}

// waitForLeaks returns the stacks of goroutines still running gRPC or this
// package's code once timeout has passed, or "" as soon as there are none.
func waitForLeaks(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaks []string
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "waitForLeaks") {
				continue
			}
			if strings.Contains(g, "google.golang.org/grpc") || strings.Contains(g, "dragon/wire") {
				leaks = append(leaks, g)
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return strings.Join(leaks, "\n\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testServer is a minimal device daemon: Health, and a Session that checks
// the handshake, answers with its own Hello and echoes pings.
type testServer struct {
	dragonv1.UnimplementedDeviceServiceServer
	dragonv1.UnimplementedPeerServiceServer
	hello *dragonv1.Hello
}

func (s *testServer) Health(context.Context, *dragonv1.HealthRequest) (*dragonv1.HealthResponse, error) {
	return &dragonv1.HealthResponse{Serving: true, ModelName: s.hello.GetModelName()}, nil
}

func (s *testServer) Session(stream dragonv1.PeerService_SessionServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	if err := wire.CheckHello(s.hello, first.GetHello()); err != nil {
		return err
	}
	if err := stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Hello{Hello: s.hello}}); err != nil {
		return err
	}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if p := m.GetPing(); p != nil {
			pong := &dragonv1.Pong{Seq: p.GetSeq(), PingSentUnixNano: p.GetSentUnixNano(), SentUnixNano: time.Now().UnixNano()}
			if err := stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Pong{Pong: pong}}); err != nil {
				return err
			}
		}
	}
}

func cloudHello() *dragonv1.Hello {
	return &dragonv1.Hello{ProtocolVersion: wire.ProtocolVersion, ModelFingerprint: "fp-smollm2", ModelName: "SmolLM2-135M-Instruct", VocabSize: 49152, Side: dragonv1.Side_SIDE_CLOUD}
}

func deviceHello() *dragonv1.Hello {
	h := cloudHello()
	h.Side = dragonv1.Side_SIDE_DEVICE
	return h
}

// lockedBuffer collects server logs written from server goroutines.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serve starts a server with cfg on an in-memory listener; it stops when
// the test ends.
func serve(t *testing.T, cfg wire.Config) *bufconn.Listener {
	t.Helper()
	opts, err := cfg.ServerOptions()
	require.NoError(t, err)
	s := grpc.NewServer(opts...)
	ts := &testServer{hello: cloudHello()}
	dragonv1.RegisterDeviceServiceServer(s, ts)
	dragonv1.RegisterPeerServiceServer(s, ts)
	lis := bufconn.Listen(1 << 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	t.Cleanup(func() {
		s.Stop()
		<-done
	})
	return lis
}

// dial connects to lis with cfg; the connection closes when the test ends
// (before the server stops: cleanups run last-in first-out).
func dial(t *testing.T, lis *bufconn.Listener, cfg wire.Config) *grpc.ClientConn {
	t.Helper()
	opts, err := cfg.DialOptions()
	require.NoError(t, err)
	opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
		return lis.DialContext(ctx)
	}))
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

func health(cc *grpc.ClientConn) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := dragonv1.NewDeviceServiceClient(cc).Health(ctx, &dragonv1.HealthRequest{})
	return err
}

// session opens a Session, sends hello and returns the first reply.
func session(cc *grpc.ClientConn, hello *dragonv1.Hello) (*dragonv1.PeerMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := dragonv1.NewPeerServiceClient(cc).Session(ctx)
	if err != nil {
		return nil, err
	}
	// Send reports io.EOF when the server already ended the call (a refused
	// token can beat the first message); Recv then returns the real status.
	if err := stream.Send(&dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Hello{Hello: hello}}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	reply, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	if err := stream.CloseSend(); err != nil {
		return nil, err
	}
	_, err = stream.Recv() // the server's io.EOF ends the call cleanly
	if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("after close: %w", err)
	}
	return reply, nil
}

func TestBearerToken(t *testing.T) {
	logs := &lockedBuffer{}
	lis := serve(t, wire.Config{
		Insecure:      true,
		Token:         "s3cret",
		NoAuthMethods: []string{"/dragon.v1.DeviceService/Stats"},
		Logger:        slog.New(slog.NewTextHandler(logs, nil)),
	})

	cases := []struct {
		name    string
		token   string
		wantErr string // empty: the call passes
	}{
		{"no token", "", "missing bearer token"},
		{"wrong token", "guess", "invalid bearer token"},
		{"good token", "s3cret", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cc := dial(t, lis, wire.Config{Insecure: true, Token: tc.token})
			for _, call := range []struct {
				kind string
				err  error
			}{
				{"unary", health(cc)},
				{"stream", func() error { _, err := session(cc, deviceHello()); return err }()},
			} {
				if tc.wantErr == "" {
					assert.NoError(t, call.err, call.kind)
					continue
				}
				assert.Equal(t, codes.Unauthenticated, status.Code(call.err), "%s: %v", call.kind, call.err)
				assert.Contains(t, status.Convert(call.err).Message(), tc.wantErr, call.kind)
			}
		})
	}
	assert.Contains(t, logs.String(), "refused unauthenticated call")
	assert.Contains(t, logs.String(), "/dragon.v1.DeviceService/Health")

	t.Run("exempt method", func(t *testing.T) {
		cc := dial(t, lis, wire.Config{Insecure: true})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := dragonv1.NewDeviceServiceClient(cc).Stats(ctx, &dragonv1.StatsRequest{})
		// Past the token check, into the unimplemented handler.
		assert.Equal(t, codes.Unimplemented, status.Code(err), "%v", err)
	})
}

func TestMalformedAuthorization(t *testing.T) {
	lis := serve(t, wire.Config{Insecure: true, Token: "s3cret", Logger: slog.New(slog.DiscardHandler)})
	opts, err := wire.Config{Insecure: true}.DialOptions()
	require.NoError(t, err)
	opts = append(opts,
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithPerRPCCredentials(basicAuth{}))
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	require.NoError(t, err)
	defer cc.Close()
	err = health(cc)
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "malformed authorization")
}

type basicAuth struct{}

func (basicAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Basic czNjcmV0"}, nil
}
func (basicAuth) RequireTransportSecurity() bool { return false }

func TestTokenNeedsTLSUnlessInsecure(t *testing.T) {
	assert.True(t, wire.BearerToken{Token: "x"}.RequireTransportSecurity())
	assert.False(t, wire.BearerToken{Token: "x", AllowInsecure: true}.RequireTransportSecurity())
}

func TestHandshakeOverStream(t *testing.T) {
	lis := serve(t, wire.Config{Insecure: true})
	cc := dial(t, lis, wire.Config{Insecure: true})

	reply, err := session(cc, deviceHello())
	require.NoError(t, err)
	assert.Equal(t, "SmolLM2-135M-Instruct", reply.GetHello().GetModelName())

	other := deviceHello()
	other.ModelFingerprint, other.ModelName, other.VocabSize = "fp-qwen", "Qwen2.5-0.5B-Instruct", 151936
	_, err = session(cc, other)
	require.Error(t, err)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	msg := status.Convert(err).Message()
	assert.Contains(t, msg, "SmolLM2-135M-Instruct")
	assert.Contains(t, msg, "Qwen2.5-0.5B-Instruct")
}

func TestMutualTLS(t *testing.T) {
	pki := newPKI(t)
	lis := serve(t, wire.Config{CertFile: pki.serverCert, KeyFile: pki.serverKey, CAFile: pki.caCert})

	t.Run("client certificate accepted", func(t *testing.T) {
		cc := dial(t, lis, wire.Config{CAFile: pki.caCert, CertFile: pki.clientCert, KeyFile: pki.clientKey, ServerName: "cloud.dragon.test"})
		require.NoError(t, health(cc))
		_, err := session(cc, deviceHello())
		require.NoError(t, err)
	})
	t.Run("client without certificate refused", func(t *testing.T) {
		cc := dial(t, lis, wire.Config{CAFile: pki.caCert, ServerName: "cloud.dragon.test"})
		err := health(cc)
		require.Error(t, err)
		assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		t.Logf("refused: %v", err)
	})
	t.Run("client certificate from another CA refused", func(t *testing.T) {
		other := newPKI(t)
		cc := dial(t, lis, wire.Config{CAFile: pki.caCert, CertFile: other.clientCert, KeyFile: other.clientKey, ServerName: "cloud.dragon.test"})
		err := health(cc)
		require.Error(t, err)
		assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	})
	t.Run("server not trusted by client", func(t *testing.T) {
		other := newPKI(t)
		cc := dial(t, lis, wire.Config{CAFile: other.caCert, CertFile: pki.clientCert, KeyFile: pki.clientKey, ServerName: "cloud.dragon.test"})
		err := health(cc)
		require.Error(t, err)
		assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		assert.Contains(t, err.Error(), "certificate")
	})
}

func TestTLSWithToken(t *testing.T) {
	pki := newPKI(t)
	lis := serve(t, wire.Config{CertFile: pki.serverCert, KeyFile: pki.serverKey, Token: "t0ken", Logger: slog.New(slog.DiscardHandler)})
	cc := dial(t, lis, wire.Config{CAFile: pki.caCert, ServerName: "cloud.dragon.test", Token: "t0ken"})
	require.NoError(t, health(cc))
	bare := dial(t, lis, wire.Config{CAFile: pki.caCert, ServerName: "cloud.dragon.test"})
	assert.Equal(t, codes.Unauthenticated, status.Code(health(bare)))
}

func TestConfigErrors(t *testing.T) {
	pki := newPKI(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("hello"), 0o600))

	cases := []struct {
		name    string
		cfg     wire.Config
		server  bool
		wantErr string
	}{
		{"server without TLS or Insecure", wire.Config{}, true, "no TLS certificate"},
		{"certificate without key", wire.Config{CertFile: pki.serverCert}, true, "must be given together"},
		{"Insecure with TLS files", wire.Config{Insecure: true, CAFile: pki.caCert}, false, "conflicts"},
		{"missing certificate file", wire.Config{CertFile: missing, KeyFile: pki.serverKey}, true, "missing.pem"},
		{"missing CA", wire.Config{CertFile: pki.serverCert, KeyFile: pki.serverKey, CAFile: missing}, true, "read CA bundle"},
		{"CA without PEM", wire.Config{CAFile: notPEM}, false, "no PEM certificate"},
		{"client key mismatch", wire.Config{CertFile: pki.clientCert, KeyFile: pki.serverKey}, false, "load client certificate"},
		{"negative keepalive", wire.Config{Insecure: true, Keepalive: wire.Keepalive{Time: -time.Second}}, true, "negative keepalive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.server {
				_, err = tc.cfg.ServerOptions()
			} else {
				_, err = tc.cfg.DialOptions()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.wantErr)
		})
	}
}

// pki is a throwaway CA with a server and a client certificate, as PEM
// files in a temporary directory.
type pki struct {
	caCert, serverCert, serverKey, clientCert, clientKey string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dragon test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)

	issue := func(name string, serial int64, usage x509.ExtKeyUsage, dns []string) (certPath, keyPath string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		require.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			DNSNames:     dns,
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		require.NoError(t, err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		require.NoError(t, err)
		certPath, keyPath = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
		writePEM(t, certPath, "CERTIFICATE", der)
		writePEM(t, keyPath, "PRIVATE KEY", keyDER)
		return certPath, keyPath
	}
	p := pki{caCert: filepath.Join(dir, "ca.crt")}
	writePEM(t, p.caCert, "CERTIFICATE", caDER)
	p.serverCert, p.serverKey = issue("cloud", 2, x509.ExtKeyUsageServerAuth, []string{"cloud.dragon.test"})
	p.clientCert, p.clientKey = issue("device", 3, x509.ExtKeyUsageClientAuth, nil)
	return p
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}
