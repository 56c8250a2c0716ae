package wire

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Defaults for zero Config fields.
const (
	DefaultKeepaliveTime     = 20 * time.Second
	DefaultKeepaliveTimeout  = 10 * time.Second
	DefaultMinClientInterval = 10 * time.Second
	// DefaultMaxMessageBytes fits a full-vocabulary distribution of a
	// 152k-token model at top-p 1 (about 1 MiB) with room to spare.
	DefaultMaxMessageBytes = 4 << 20
	// DefaultCallTimeout bounds unary calls (health, stats) without a
	// deadline of their own.
	DefaultCallTimeout = 10 * time.Second
)

// Config is what both daemons need to build their gRPC options. The zero
// value is not usable: choose TLS (CertFile/KeyFile) or set Insecure.
type Config struct {
	// CertFile and KeyFile are PEM files. Server: its certificate, which
	// turns TLS on. Client: a client certificate, presented for mutual TLS.
	CertFile, KeyFile string
	// CAFile is a PEM bundle of CA certificates. Server: client
	// certificates must chain to it (mutual TLS). Client: the server's
	// certificate must chain to it (system roots when empty).
	CAFile string
	// ServerName overrides the name a client checks the server certificate
	// against (default: the host of the dial target).
	ServerName string
	// Insecure runs without TLS: tokens and traffic go in clear text. Only
	// for tests and loopback experiments.
	Insecure bool

	// Token is the shared bearer token. Server: every call must carry
	// "authorization: Bearer <Token>" (none when empty). Client: sent on
	// every call.
	Token string
	// NoAuthMethods are full method names the server serves without a
	// token, e.g. "/grpc.health.v1.Health/Check" for orchestrator probes.
	NoAuthMethods []string

	Keepalive Keepalive
	// MaxMessageBytes caps one message each way (default
	// DefaultMaxMessageBytes).
	MaxMessageBytes int
	// CallTimeout (client) is the deadline given to unary calls that carry
	// none (default DefaultCallTimeout; negative: none). Streams are left
	// alone: a peer session lives as long as its generation, and keepalive
	// is what detects a dead peer there.
	CallTimeout time.Duration

	// Logger receives refused calls (default slog.Default()).
	Logger *slog.Logger
}

// Keepalive detects dead peers on the long-lived peer stream. Phones change
// networks and NATs drop idle mappings; without pings a generation would
// hang on a connection that is gone. Zero fields take the defaults.
type Keepalive struct {
	// Time: after this long without any frame, ping the other end (both
	// server and client do). The client floors this at 10s (gRPC's own
	// minimum).
	Time time.Duration
	// Timeout: close the connection when a ping goes unanswered this long.
	// Both sides; RPCs on it then fail with Unavailable.
	Timeout time.Duration
	// MinClientInterval (server only): clients pinging more often than this
	// are disconnected with GOAWAY "too_many_pings". Keep it at or below
	// the clients' Time.
	MinClientInterval time.Duration
	// NoIdlePings: do not ping, or allow pings, on connections with no
	// active RPC. By default idle connections are pinged, so a device
	// finds out the cloud is gone before the next prompt, not during it.
	NoIdlePings bool
}

func (c Config) withDefaults() Config {
	if c.Keepalive.Time == 0 {
		c.Keepalive.Time = DefaultKeepaliveTime
	}
	if c.Keepalive.Timeout == 0 {
		c.Keepalive.Timeout = DefaultKeepaliveTimeout
	}
	if c.Keepalive.MinClientInterval == 0 {
		c.Keepalive.MinClientInterval = DefaultMinClientInterval
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if c.CallTimeout == 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	if c.Keepalive.Time < 0 || c.Keepalive.Timeout < 0 || c.Keepalive.MinClientInterval < 0 {
		return errors.New("wire: negative keepalive duration")
	}
	if c.MaxMessageBytes < 0 {
		return fmt.Errorf("wire: negative MaxMessageBytes %d", c.MaxMessageBytes)
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return fmt.Errorf("wire: certificate %q and key %q must be given together", c.CertFile, c.KeyFile)
	}
	if c.Insecure && (c.CertFile != "" || c.CAFile != "") {
		return errors.New("wire: Insecure conflicts with TLS files; drop one")
	}
	return nil
}

// ServerOptions builds the options of a daemon's gRPC server.
func (c Config) ServerOptions() ([]grpc.ServerOption, error) {
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	creds, err := c.serverCredentials()
	if err != nil {
		return nil, err
	}
	opts := []grpc.ServerOption{
		grpc.Creds(creds),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:    c.Keepalive.Time,
			Timeout: c.Keepalive.Timeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             c.Keepalive.MinClientInterval,
			PermitWithoutStream: !c.Keepalive.NoIdlePings,
		}),
		grpc.MaxRecvMsgSize(c.MaxMessageBytes),
		grpc.MaxSendMsgSize(c.MaxMessageBytes),
	}
	if c.Token != "" {
		a := newAuthenticator(c.Token, c.NoAuthMethods, c.Logger)
		opts = append(opts, grpc.ChainUnaryInterceptor(a.unary), grpc.ChainStreamInterceptor(a.stream))
	}
	return opts, nil
}

// DialOptions builds the options a client (the device, or `dragon ask`)
// passes to grpc.NewClient.
func (c Config) DialOptions() ([]grpc.DialOption, error) {
	c = c.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	creds, err := c.clientCredentials()
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time:                c.Keepalive.Time,
			Timeout:             c.Keepalive.Timeout,
			PermitWithoutStream: !c.Keepalive.NoIdlePings,
		}),
		grpc.WithDefaultCallOptions(
			grpc.MaxCallRecvMsgSize(c.MaxMessageBytes),
			grpc.MaxCallSendMsgSize(c.MaxMessageBytes),
		),
	}
	if c.CallTimeout > 0 {
		opts = append(opts, grpc.WithChainUnaryInterceptor(deadline(c.CallTimeout)))
	}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(BearerToken{Token: c.Token, AllowInsecure: c.Insecure}))
	}
	return opts, nil
}

func (c Config) serverCredentials() (credentials.TransportCredentials, error) {
	if c.Insecure {
		return insecure.NewCredentials(), nil
	}
	if c.CertFile == "" {
		return nil, errors.New("wire: no TLS certificate: set CertFile and KeyFile, or Insecure for plaintext")
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("wire: load server certificate %s: %w", c.CertFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return credentials.NewTLS(cfg), nil
}

func (c Config) clientCredentials() (credentials.TransportCredentials, error) {
	if c.Insecure {
		return insecure.NewCredentials(), nil
	}
	cfg := &tls.Config{ServerName: c.ServerName, MinVersion: tls.VersionTLS12}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("wire: load client certificate %s: %w", c.CertFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

func loadPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("wire: read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("wire: CA bundle %s holds no PEM certificate", path)
	}
	return pool, nil
}

// BearerToken is the client side of token authentication: it sends
// "authorization: Bearer <Token>" with every call.
type BearerToken struct {
	Token string
	// AllowInsecure lets the token travel without TLS (tests, loopback);
	// otherwise gRPC refuses to send it over a plaintext connection.
	AllowInsecure bool
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.Token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b BearerToken) RequireTransportSecurity() bool { return !b.AllowInsecure }

// authenticator is the server side of token authentication.
type authenticator struct {
	want   [sha256.Size]byte // hashed, so comparing takes the same time for any length
	exempt []string
	log    *slog.Logger
}

func newAuthenticator(token string, exempt []string, log *slog.Logger) *authenticator {
	return &authenticator{want: sha256.Sum256([]byte(token)), exempt: exempt, log: log}
}

func (a *authenticator) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.check(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *authenticator) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

func (a *authenticator) check(ctx context.Context, method string) error {
	if slices.Contains(a.exempt, method) {
		return nil
	}
	err := a.verify(ctx)
	if err != nil {
		addr := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		a.log.Warn("refused unauthenticated call", "method", method, "peer", addr, "err", status.Convert(err).Message())
	}
	return err
}

func (a *authenticator) verify(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated,
			`missing bearer token: this server requires "authorization: Bearer <token>" metadata (the daemons' --token flag)`)
	}
	scheme, token, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return status.Error(codes.Unauthenticated, `malformed authorization metadata: want "Bearer <token>"`)
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(token)))
	if subtle.ConstantTimeCompare(got[:], a.want[:]) != 1 {
		return status.Error(codes.Unauthenticated, "invalid bearer token: it does not match the server's --token")
	}
	return nil
}

// deadline gives unary calls without a deadline one of d.
func deadline(d time.Duration) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}
