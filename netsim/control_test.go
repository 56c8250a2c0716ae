package netsim

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// call sends a request to h and returns the status and the decoded body.
func call(t *testing.T, h http.Handler, method, path, body string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, strings.NewReader(body)))
	var out map[string]any
	if rec.Code != http.StatusMethodNotAllowed {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &out), rec.Body.String())
		assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	}
	return rec.Code, out
}

func TestControlRoundTrip(t *testing.T) {
	const ms = time.Millisecond
	link, err := NewLink(Shape{Latency: 40 * ms}, 1)
	require.NoError(t, err)
	h := ControlHandler(link)

	code, got := call(t, h, "GET", "/shape", "")
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, map[string]any{
		"latency": "40ms", "jitter": "0s", "jitter_kind": "normal", "period": "0s",
		"rate": 0.0, "stall_prob": 0.0, "stall_for": "0s",
	}, got["up"])

	code, got = call(t, h, "PUT", "/shape", `{"up":{"latency":"150ms","rate":"1MB/s","jitter":"20ms","jitter_kind":"sine","period":"5s"}}`)
	require.Equal(t, http.StatusOK, code, got)
	assert.Equal(t, Shape{Latency: 150 * ms, Jitter: 20 * ms, Dist: Sine, Period: 5 * time.Second, Rate: 1_000_000}, link.Up.Shape())
	assert.Equal(t, Shape{Latency: 40 * ms}, link.Down.Shape(), "down unchanged")
	assert.Equal(t, 1e6, got["up"].(map[string]any)["rate"])

	code, _ = call(t, h, "POST", "/shape", `{"both":{"stall_prob":0.5,"stall_for":"1s"},"down":{"rate":2000}}`)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, Shape{Latency: 150 * ms, Jitter: 20 * ms, Dist: Sine, Period: 5 * time.Second, Rate: 1_000_000, StallProb: 0.5, StallFor: time.Second}, link.Up.Shape())
	assert.Equal(t, Shape{Latency: 40 * ms, Rate: 2000, StallProb: 0.5, StallFor: time.Second}, link.Down.Shape())

	_, got = call(t, h, "GET", "/shape", "")
	assert.Equal(t, "1s", got["down"].(map[string]any)["stall_for"])
}

func TestControlBadInput(t *testing.T) {
	link, err := NewLink(Shape{Latency: 40 * time.Millisecond}, 1)
	require.NoError(t, err)
	h := ControlHandler(link)
	for _, tc := range []struct{ body, err string }{
		{`{"up":{"latency":"fast"}}`, `invalid duration "fast"`},
		{`{"up":{"latency":150}}`, "cannot unmarshal number"},
		{`{"up":{"latency":"-5ms"}}`, "negative latency"},
		{`{"down":{"stall_prob":2}}`, "outside [0, 1]"},
		{`{"both":{"jitter_kind":"pareto"}}`, `unknown jitter kind "pareto"`},
		{`{"up":{"rate":"8Mb"}}`, `unknown unit "Mb"`},
		{`{"up":{"rate":-1}}`, "non-negative"},
		{`{"up":{"latncy":"1ms"}}`, `unknown field "latncy"`},
		{`{"sideways":{}}`, `unknown field "sideways"`},
		{`{}`, `give "up", "down" or "both"`},
		{`{"up":`, "unexpected EOF"},
		// The good half of a bad request is not applied either.
		{`{"up":{"latency":"1ms"},"down":{"period":"-1s"}}`, "negative sine period"},
	} {
		code, got := call(t, h, "PUT", "/shape", tc.body)
		assert.Equal(t, http.StatusBadRequest, code, tc.body)
		assert.Contains(t, got["error"], tc.err, tc.body)
		t.Logf("%s: %v", tc.body, got["error"])
	}
	assert.Equal(t, Shape{Latency: 40 * time.Millisecond}, link.Up.Shape(), "nothing changed")
	assert.Equal(t, Shape{Latency: 40 * time.Millisecond}, link.Down.Shape(), "nothing changed")

	code, got := call(t, h, "POST", "/reset", "")
	assert.Equal(t, http.StatusNotImplemented, code, "no proxy")
	assert.Contains(t, got["error"], "no proxy")
	code, _ = call(t, h, "DELETE", "/shape", "")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
}

// TestControlResetsProxy: POST /reset on a proxy's handler resets its
// connections, over real HTTP.
func TestControlResetsProxy(t *testing.T) {
	up := echoServer(t)
	link, err := NewLink(Shape{}, 1)
	require.NoError(t, err)
	p, err := NewProxy("127.0.0.1:0", up.Addr().String(), link, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- p.Serve(ctx) }()
	srv := httptest.NewServer(p.ControlHandler())

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	roundTrips(t, c, 1)
	resp, err := http.Post(srv.URL+"/reset", "", nil)
	require.NoError(t, err)
	var got map[string]int
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, map[string]int{"reset": 1}, got)
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err, "the connection is gone")

	srv.Close()
	http.DefaultClient.CloseIdleConnections()
	cancel()
	require.NoError(t, <-done)
}
