package wire

import (
	"github.com/spf13/pflag"
)

// RegisterFlags binds c to command-line flags, so both daemons and the
// client take TLS, mutual TLS, the token, keepalive, message size and call
// deadlines the same way. prefix names the link (e.g. "peer-" for the
// device's connection to the cloud); the token may also come from an
// environment variable through tokenEnv, read by the caller.
func (c *Config) RegisterFlags(f *pflag.FlagSet, prefix string) {
	f.StringVar(&c.CertFile, prefix+"tls-cert", "", "PEM certificate: the server's (turns TLS on) or the client's (mutual TLS)")
	f.StringVar(&c.KeyFile, prefix+"tls-key", "", "PEM private key of --"+prefix+"tls-cert")
	f.StringVar(&c.CAFile, prefix+"tls-ca", "", "PEM CA bundle: server: client certificates must chain to it (mutual TLS); client: the server's must (default: system roots)")
	f.StringVar(&c.ServerName, prefix+"tls-server-name", "", "name to check the server certificate against (default: the dial target's host)")
	f.BoolVar(&c.Insecure, prefix+"insecure", false, "no TLS: traffic and token in clear text (tests and loopback only)")
	f.StringVar(&c.Token, prefix+"token", "", "shared bearer token (server: required on every call when set)")
	f.DurationVar(&c.Keepalive.Time, prefix+"keepalive", DefaultKeepaliveTime, "ping the other end after this long without a frame")
	f.DurationVar(&c.Keepalive.Timeout, prefix+"keepalive-timeout", DefaultKeepaliveTimeout, "drop the connection when a ping is unanswered this long")
	f.IntVar(&c.MaxMessageBytes, prefix+"max-message-bytes", DefaultMaxMessageBytes, "largest message each way")
	f.DurationVar(&c.CallTimeout, prefix+"call-timeout", DefaultCallTimeout, "deadline of unary calls that carry none (negative: none)")
}
