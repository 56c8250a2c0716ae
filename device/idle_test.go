package device

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/fake"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// unloadable is a fake model that can unload: it counts open contexts and
// records an unload that would free weights a context still uses, or a
// decode on weights that were freed.
type unloadable struct {
	*fake.Model
	mu        sync.Mutex
	open      int
	loaded    bool
	unloads   int
	loads     int
	violation error
}

func newUnloadable() *unloadable {
	return &unloadable{Model: fake.New(fake.Config{Seed: 3, Vocab: 300}), loaded: true}
}

func (m *unloadable) NewContext(opts engine.ContextOptions) (engine.Context, error) {
	c, err := m.Model.NewContext(opts)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.loaded {
		m.loaded = true
		m.loads++
	}
	m.open++
	return &countedContext{Context: c, m: m}, nil
}

func (m *unloadable) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.open > 0 {
		m.violation = errors.New("unloaded with a context open")
		return m.violation
	}
	if m.loaded {
		m.loaded = false
		m.unloads++
	}
	return nil
}

func (m *unloadable) counts() (unloads, loads int, loaded bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.unloads, m.loads, m.loaded
}

func (m *unloadable) err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.violation
}

type countedContext struct {
	engine.Context
	m      *unloadable
	closed bool
}

func (c *countedContext) Decode(ctx context.Context, b *engine.Batch) error {
	c.m.mu.Lock()
	if !c.m.loaded {
		c.m.violation = errors.New("decoded on unloaded weights")
	}
	c.m.mu.Unlock()
	return c.Context.Decode(ctx, b)
}

func (c *countedContext) Close() error {
	if !c.closed {
		c.closed = true
		c.m.mu.Lock()
		c.m.open--
		c.m.mu.Unlock()
	}
	return c.Context.Close()
}

func idleServer(t *testing.T, m engine.Model, idle time.Duration) *Server {
	t.Helper()
	srv, err := New(Config{SideConfig: session.SideConfig{
		Model: m, Decoder: decoder.Options{MaxPassages: 2, CtxPerSeq: 256},
		Limits:   session.Limits{MaxTokens: 64, MaxPassages: 2, MaxPrompt: 100},
		Defaults: session.Defaults{MaxTokens: 8, Mode: dragonv1.Mode_MODE_DEVICE_ONLY},
	}, IdleUnload: idle})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	return srv
}

func answer(t *testing.T, srv *Server, send func(*dragonv1.GenerateResponse) error) string {
	t.Helper()
	var text string
	err := srv.Serve(context.Background(), &dragonv1.GenerateRequest{Prompt: "hello?"}, func(r *dragonv1.GenerateResponse) error {
		text += r.GetChunk().GetText()
		if send != nil {
			return send(r)
		}
		return nil
	})
	require.NoError(t, err)
	return text
}

// TestIdleUnloadLoadsBack: an idle server frees its context and the
// model, and the next generation loads them back and answers the same.
func TestIdleUnloadLoadsBack(t *testing.T) {
	m := newUnloadable()
	srv := idleServer(t, m, 20*time.Millisecond)
	want := answer(t, srv, nil)
	require.Eventually(t, func() bool { return !srv.ModelLoaded() }, 5*time.Second, time.Millisecond)
	unloads, _, loaded := m.counts()
	assert.Equal(t, 1, unloads)
	assert.False(t, loaded)

	assert.Equal(t, want, answer(t, srv, nil), "loaded back: the same answer")
	_, loads, _ := m.counts()
	assert.Equal(t, 1, loads)
	require.Eventually(t, func() bool { u, _, _ := m.counts(); return u == 2 }, 5*time.Second, time.Millisecond, "idle again: unloaded again")
	assert.NoError(t, m.err())
}

// TestIdleUnloadWaitsForTheGeneration: a generation longer than the idle
// time keeps the model; the timer starts when it ends.
func TestIdleUnloadWaitsForTheGeneration(t *testing.T) {
	m := newUnloadable()
	idle := 10 * time.Millisecond
	srv := idleServer(t, m, idle)
	answer(t, srv, func(*dragonv1.GenerateResponse) error {
		time.Sleep(3 * idle) // each chunk outlasts the idle time
		return nil
	})
	unloads, _, _ := m.counts()
	assert.Zero(t, unloads, "nothing unloaded while the generation ran")
	require.Eventually(t, func() bool { return !srv.ModelLoaded() }, 5*time.Second, time.Millisecond)
	assert.NoError(t, m.err())
}

// TestIdleUnloadRacesGenerations: generations arriving around the moment
// the timer fires never meet freed weights (run with -race).
func TestIdleUnloadRacesGenerations(t *testing.T) {
	m := newUnloadable()
	srv := idleServer(t, m, time.Millisecond)
	want := answer(t, srv, nil)
	for i := range 30 {
		time.Sleep(time.Duration(i%4) * 500 * time.Microsecond)
		assert.Equal(t, want, answer(t, srv, nil))
	}
	unloads, loads, _ := m.counts()
	assert.Positive(t, unloads)
	assert.LessOrEqual(t, loads, unloads)
	assert.NoError(t, m.err())
}

// TestIdleUnloadNeedsAnUnloader: a model that cannot unload is refused
// at start-up, not at the first idle moment.
func TestIdleUnloadNeedsAnUnloader(t *testing.T) {
	_, err := New(Config{SideConfig: session.SideConfig{Model: fake.New(fake.Config{Vocab: 300})}, IdleUnload: time.Second})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "idle unload")
}
