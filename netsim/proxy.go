package netsim

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Proxy forwards TCP connections from a listening address to an upstream
// one through a Link: what the client sends is delayed by Up, what the
// upstream answers by Down.
type Proxy struct {
	link     *Link
	upstream string
	ln       net.Listener
	log      *slog.Logger

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on listen (host:port; port 0 picks one) for connections
// to forward to upstream.
func NewProxy(listen, upstream string, link *Link, log *slog.Logger) (*Proxy, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	return &Proxy{link: link, upstream: upstream, ln: ln, log: log, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Link is the proxy's link, to change its shape while it runs.
func (p *Proxy) Link() *Link { return p.link }

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
			return err
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

func (p *Proxy) track(c net.Conn, add bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		if p.closed {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
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
	if !p.track(client, true) || !p.track(up, true) {
		client.Close()
		up.Close()
		return
	}
	defer p.track(client, false)
	defer p.track(up, false)
	toUp, toClient := Wrap(up, p.link.Up), Wrap(client, p.link.Down)
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
	go pipe(toUp, client)
	go pipe(toClient, up)
	wg.Wait()
	toUp.Close()
	toClient.Close()
}

// Close stops accepting and cuts every forwarded connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}
