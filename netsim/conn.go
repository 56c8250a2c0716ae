package netsim

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// closeTimeout bounds how long Close waits for what is in flight.
const closeTimeout = 10 * time.Second

// chunk is data due for delivery at a time.
type chunk struct {
	at   time.Time
	data []byte
}

// Conn is a net.Conn whose writes reach the peer as the direction shapes
// them (delay, bandwidth, stalls), in order. Reads are untouched: shape
// the other end (or use a Proxy) for the other direction.
type Conn struct {
	net.Conn
	dir *Direction

	// wmu keeps a write that waits for room in one piece among
	// concurrent writers.
	wmu sync.Mutex

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []chunk
	buffered int
	last     time.Time // delivery time of the last chunk: never earlier
	err      error     // the pump's write error
	shut     bool      // no more writes: the pump drains the queue and ends
	closed   bool      // Close was called
	done     chan struct{}

	abortOnce sync.Once
	abort     chan struct{} // closed to drop what is in flight at once
}

// Wrap shapes c's writes with dir.
func Wrap(c net.Conn, dir *Direction) *Conn {
	s := &Conn{Conn: c, dir: dir, done: make(chan struct{}), abort: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	go s.pump()
	return s
}

// Write queues b for delivery as the direction shapes it and returns at
// once, unless more than the direction's window is in flight: then it
// waits for room, as on a full socket buffer.
func (s *Conn) Write(b []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for len(b) > 0 {
		window := s.dir.window()
		for s.buffered >= window && s.err == nil && !s.shut {
			s.cond.Wait()
		}
		if s.err != nil {
			return n, s.err
		}
		if s.shut {
			return n, net.ErrClosed
		}
		k, at := s.dir.send(min(len(b), window-s.buffered))
		if at.Before(s.last) {
			at = s.last // a stream keeps its order
		}
		s.last = at
		s.queue = append(s.queue, chunk{at: at, data: append([]byte(nil), b[:k]...)})
		s.buffered += k
		s.cond.Broadcast()
		b, n = b[k:], n+k
	}
	return n, nil
}

// pump delivers queued chunks when they are due.
func (s *Conn) pump() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && !s.shut {
			s.cond.Wait()
		}
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return
		}
		c := s.queue[0]
		s.mu.Unlock()
		if wait := c.at.Sub(s.dir.now()); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.abort:
				t.Stop()
				return
			}
		}
		_, err := s.Conn.Write(c.data)
		s.mu.Lock()
		if len(s.queue) > 0 { // else dropped meanwhile
			s.queue = s.queue[1:]
			s.buffered -= len(c.data)
		}
		if err != nil && s.err == nil {
			s.err = err
			s.queue, s.buffered = nil, 0
		}
		s.cond.Broadcast()
		stop := s.err != nil
		s.mu.Unlock()
		if stop {
			return
		}
	}
}

// stop refuses further writes; with drop, it also discards what is in
// flight and wakes the pump from its wait.
func (s *Conn) stop(drop bool) {
	s.mu.Lock()
	s.shut = true
	if drop {
		s.queue, s.buffered = nil, 0
	}
	s.cond.Broadcast()
	s.mu.Unlock()
	if drop {
		s.abortOnce.Do(func() { close(s.abort) })
	}
}

// Close delivers what is in flight (for at most closeTimeout), then
// closes the connection.
func (s *Conn) Close() error {
	s.mu.Lock()
	already := s.closed
	s.closed = true
	s.mu.Unlock()
	if already {
		return net.ErrClosed
	}
	s.stop(false)
	select {
	case <-s.done:
	case <-time.After(closeTimeout):
	}
	err := s.Conn.Close() // also ends a pump blocked writing
	s.stop(true)
	<-s.done
	return err
}

// CloseWrite delivers what is in flight, then half-closes a TCP
// connection (a proxy passes the end of one direction on this way).
func (s *Conn) CloseWrite() error {
	s.stop(false)
	<-s.done
	select {
	case <-s.abort:
		return net.ErrClosed // dropped or reset: no FIN after it
	default:
	}
	if cw, ok := s.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.New("netsim: connection cannot half-close")
}

// Reset drops what is in flight and closes the connection with a TCP
// reset (RST) instead of a FIN, so that the peer sees the connection lost
// (ECONNRESET) rather than ended.
func (s *Conn) Reset() error {
	var linger error
	if tc, ok := s.Conn.(*net.TCPConn); ok {
		linger = tc.SetLinger(0)
	}
	if err := errors.Join(linger, s.cut()); err != nil {
		return fmt.Errorf("netsim: reset: %w", err)
	}
	return nil
}

// cut drops what is in flight and closes the connection at once; the
// pump and any reader end on their errors.
func (s *Conn) cut() error {
	s.stop(true)
	return s.Conn.Close()
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
