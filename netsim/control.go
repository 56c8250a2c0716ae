package netsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// duration is a time.Duration written as in Go ("150ms") in JSON.
type duration time.Duration

func (d duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

func (d *duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%w (want a duration like \"150ms\")", err)
	}
	*d = duration(v)
	return nil
}

// shapeJSON is Shape on the wire: readable durations, the rate in bytes/s.
type shapeJSON struct {
	Latency    duration `json:"latency"`
	Jitter     duration `json:"jitter"`
	JitterKind Jitter   `json:"jitter_kind"`
	Period     duration `json:"period"`
	Rate       Rate     `json:"rate"`
	StallProb  float64  `json:"stall_prob"`
	StallFor   duration `json:"stall_for"`
}

// MarshalJSON writes the shape as
//
//	{"latency":"150ms","jitter":"30ms","jitter_kind":"normal","period":"0s",
//	 "rate":1000000,"stall_prob":0,"stall_for":"0s"}
//
// with the rate in bytes/s (0: unlimited).
func (s Shape) MarshalJSON() ([]byte, error) {
	return json.Marshal(shapeJSON{
		Latency: duration(s.Latency), Jitter: duration(s.Jitter), JitterKind: s.Dist, Period: duration(s.Period),
		Rate: s.Rate, StallProb: s.StallProb, StallFor: duration(s.StallFor),
	})
}

// UnmarshalJSON reads what MarshalJSON writes, the rate also as a string
// ParseRate accepts ("1MB/s"). Fields left out keep their value in s, so
// that decoding into the current shape changes only the fields given;
// unknown fields are errors.
func (s *Shape) UnmarshalJSON(b []byte) error {
	j := shapeJSON{
		Latency: duration(s.Latency), Jitter: duration(s.Jitter), JitterKind: s.Dist, Period: duration(s.Period),
		Rate: s.Rate, StallProb: s.StallProb, StallFor: duration(s.StallFor),
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&j); err != nil {
		return err
	}
	*s = Shape{
		Latency: time.Duration(j.Latency), Jitter: time.Duration(j.Jitter), Dist: j.JitterKind, Period: time.Duration(j.Period),
		Rate: j.Rate, StallProb: j.StallProb, StallFor: time.Duration(j.StallFor),
	}
	return nil
}

// ControlHandler is an HTTP API to read and change link's shapes while it
// runs:
//
//	GET /shape         {"up": Shape, "down": Shape}
//	PUT or POST /shape {"up": {...}, "down": {...}, "both": {...}}: any of
//	                   them, each changing only the fields it gives ("both"
//	                   first); answers like GET
//	POST /reset        resets the connections of a Proxy (see
//	                   Proxy.ControlHandler; 501 here), answers {"reset": n}
//
// Bad input is a 400 with {"error": "..."}, and changes nothing.
func ControlHandler(link *Link) http.Handler { return newControl(link, nil) }

// control serves ControlHandler; reset is nil without a proxy.
type control struct {
	link  *Link
	reset func() int
	mu    sync.Mutex // a change reads the shapes, then sets them
}

func newControl(link *Link, reset func() int) http.Handler {
	c := &control{link: link, reset: reset}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /shape", c.getShape)
	mux.HandleFunc("PUT /shape", c.setShape)
	mux.HandleFunc("POST /shape", c.setShape)
	mux.HandleFunc("POST /reset", c.resetConns)
	return mux
}

// maxBody bounds a request body: a shape is a few hundred bytes.
const maxBody = 64 << 10

type shapes struct {
	Up   Shape `json:"up"`
	Down Shape `json:"down"`
}

func (c *control) getShape(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, shapes{Up: c.link.Up.Shape(), Down: c.link.Down.Shape()})
}

func (c *control) setShape(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Up   json.RawMessage `json:"up"`
		Down json.RawMessage `json:"down"`
		Both json.RawMessage `json:"both"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("shape request: %w", err))
		return
	}
	if req.Up == nil && req.Down == nil && req.Both == nil {
		writeError(w, http.StatusBadRequest, errors.New(`shape request: give "up", "down" or "both"`))
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	next := shapes{Up: c.link.Up.Shape(), Down: c.link.Down.Shape()}
	for _, ch := range []struct {
		name string
		raw  json.RawMessage
		into []*Shape
	}{
		{"both", req.Both, []*Shape{&next.Up, &next.Down}},
		{"up", req.Up, []*Shape{&next.Up}},
		{"down", req.Down, []*Shape{&next.Down}},
	} {
		if ch.raw == nil {
			continue
		}
		for _, s := range ch.into {
			err := json.Unmarshal(ch.raw, s)
			if err == nil {
				err = s.Validate()
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Errorf("shape %q: %w", ch.name, err))
				return
			}
		}
	}
	// Both are valid: neither SetShape fails.
	_ = c.link.Up.SetShape(next.Up)
	_ = c.link.Down.SetShape(next.Down)
	writeJSON(w, http.StatusOK, next)
}

func (c *control) resetConns(w http.ResponseWriter, _ *http.Request) {
	if c.reset == nil {
		writeError(w, http.StatusNotImplemented, errors.New("no proxy to reset"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"reset": c.reset()})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v) // the client is gone: nothing to tell
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}
