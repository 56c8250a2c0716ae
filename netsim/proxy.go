package netsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a listening address to an upstream
// one through a Link: what the client sends is shaped by Up, what the
// upstream answers by Down.
type Proxy struct {
	link     *Link
	upstream string
	ln       net.Listener
	log      *slog.Logger

	mu     sync.Mutex
	flows  map[*flow]struct{}
	closed bool
	wg     sync.WaitGroup
}

// flow is one forwarded connection: its two shaped ends.
type flow struct {
	toUp     *Conn // the upstream connection, shaped by Up
	toClient *Conn // the client connection, shaped by Down
}

// NewProxy listens on listen (host:port; port 0 picks one) for connections
// to forward to upstream.
func NewProxy(listen, upstream string, link *Link, log *slog.Logger) (*Proxy, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("netsim: proxy: %w", err)
	}
	return &Proxy{link: link, upstream: upstream, ln: ln, log: log, flows: map[*flow]struct{}{}}, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Link is the proxy's link, to change its shape while it runs.
func (p *Proxy) Link() *Link { return p.link }

// ControlHandler is the HTTP control API of the proxy's link, whose POST
// /reset resets the proxy's connections.
func (p *Proxy) ControlHandler() http.Handler { return newControl(p.link, p.Reset) }

// Serve forwards connections until ctx is done or Close is called.
func (p *Proxy) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { p.Close() })
	defer stop()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if p.isClosed() {
				return nil
			}
			return fmt.Errorf("netsim: proxy: %w", err)
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.forward(c)
		}()
	}
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

func (p *Proxy) track(f *flow, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		if p.closed {
			return false
		}
		p.flows[f] = struct{}{}
	} else {
		delete(p.flows, f)
	}
	return true
}

func (p *Proxy) forward(client net.Conn) {
	up, err := net.DialTimeout("tcp", p.upstream, 10*time.Second)
	if err != nil {
		p.log.Warn("netsim: upstream unreachable", "upstream", p.upstream, "err", err)
		client.Close()
		return
	}
	f := &flow{toUp: Wrap(up, p.link.Up), toClient: Wrap(client, p.link.Down)}
	defer f.toUp.Close()
	defer f.toClient.Close()
	if !p.track(f, true) {
		return
	}
	defer p.track(f, false)
	var wg sync.WaitGroup
	wg.Add(2)
	pipe := func(dst *Conn, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			p.log.Debug("netsim: connection ended", "err", err)
		}
		_ = dst.CloseWrite()
	}
	go pipe(f.toUp, client)
	go pipe(f.toClient, up)
	wg.Wait()
}

// Reset cuts every forwarded connection with a TCP reset (RST) at both
// ends, as a middlebox that loses its state or a dropped mobile link does;
// the proxy goes on accepting new ones. It returns how many it reset.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for f := range p.flows {
		// Both ends stop before either is reset, so that the pipe seeing
		// one end go cannot half-close the other with a FIN first.
		f.toClient.stop(true)
		f.toUp.stop(true)
		for _, c := range []*Conn{f.toClient, f.toUp} {
			if err := c.Reset(); err != nil {
				p.log.Debug("netsim: reset", "err", err)
			}
		}
	}
	return len(p.flows)
}

// Close stops accepting and cuts every forwarded connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for f := range p.flows {
		_ = f.toUp.cut() // closing: the errors say only that it is closed
		_ = f.toClient.cut()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}
