package netsim

import (
	"errors"
	"net"
	"sync"
	"time"
)

// maxBuffered bounds the bytes a shaped connection holds in flight; a
// writer beyond it waits, as it would on a full socket buffer.
const maxBuffered = 8 << 20

// chunk is data due for delivery at a time.
type chunk struct {
	at   time.Time
	data []byte
}

// Conn is a net.Conn whose writes reach the peer after the direction's
// delay, in order. Reads are untouched: shape the other end (or use a
// Proxy) for the other direction.
type Conn struct {
	net.Conn
	dir *Direction

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []chunk
	buffered int
	last     time.Time // delivery time of the last chunk: never earlier
	err      error     // the pump's write error
	closed   bool
	done     chan struct{}
}

// Wrap shapes c's writes with dir.
func Wrap(c net.Conn, dir *Direction) *Conn {
	s := &Conn{Conn: c, dir: dir, done: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.pump()
	return s
}

// Write queues b for delivery after the direction's delay and returns at
// once (unless too much is in flight).
func (s *Conn) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for s.buffered+len(b) > maxBuffered && s.buffered > 0 && s.err == nil && !s.closed {
		s.cond.Wait()
	}
	if s.err != nil {
		return 0, s.err
	}
	if s.closed {
		return 0, net.ErrClosed
	}
	at := time.Now().Add(s.dir.Delay())
	if at.Before(s.last) {
		at = s.last // a stream keeps its order
	}
	s.last = at
	s.queue = append(s.queue, chunk{at: at, data: append([]byte(nil), b...)})
	s.buffered += len(b)
	s.cond.Broadcast()
	return len(b), nil
}

// pump delivers queued chunks when they are due.
func (s *Conn) pump() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		c := s.queue[0]
		s.mu.Unlock()
		if wait := time.Until(c.at); wait > 0 {
			time.Sleep(wait)
		}
		_, err := s.Conn.Write(c.data)
		s.mu.Lock()
		s.queue = s.queue[1:]
		s.buffered -= len(c.data)
		if err != nil && s.err == nil {
			s.err = err
			s.queue = nil
		}
		s.cond.Broadcast()
		stop := s.err != nil
		s.mu.Unlock()
		if stop {
			return
		}
	}
}

// Close delivers what is in flight, then closes the connection.
func (s *Conn) Close() error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	if already {
		return net.ErrClosed
	}
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
	}
	return s.Conn.Close()
}

// CloseWrite delivers what is in flight, then half-closes a TCP
// connection (a proxy passes the end of one direction on this way).
func (s *Conn) CloseWrite() error {
	s.mu.Lock()
	s.closed = true
	s.cond.Broadcast()
	s.mu.Unlock()
	<-s.done
	if cw, ok := s.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("netsim: connection cannot half-close")
}

// Listener shapes the writes of every connection it accepts (the server →
// client direction).
type Listener struct {
	net.Listener
	dir *Direction
}

// Listen wraps l.
func Listen(l net.Listener, dir *Direction) *Listener { return &Listener{Listener: l, dir: dir} }

// Accept implements net.Listener.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return Wrap(c, l.dir), nil
}
