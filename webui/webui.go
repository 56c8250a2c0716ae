// Package webui serves the device's page: a chat for the device's owner
// over the daemon's own APIs (the OpenAI-compatible one, the document
// API), and the status it shows. Every asset is embedded in the binary,
// so the page works offline and loads nothing from elsewhere; the script
// is plain JavaScript, with no build step.
package webui

import (
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed assets
var assets embed.FS

// Status is what the page's status line shows (GET /v1/status).
type Status struct {
	DeviceModel string      `json:"device_model"`
	Cloud       CloudStatus `json:"cloud"`
	Generating  bool        `json:"generating"`
	Queued      int         `json:"queued"`
	// Documents: the device serves its document API.
	Documents bool     `json:"documents"`
	Defaults  Defaults `json:"defaults"`
	Modes     []string `json:"modes"`
}

// CloudStatus is the device's link to the cloud.
type CloudStatus struct {
	Configured bool `json:"configured"`
	// State is the connection's (gRPC's connectivity state, lower case:
	// idle, connecting, ready, transient_failure, shutdown).
	State string `json:"state,omitempty"`
	// Model is what the cloud named in its latest handshake.
	Model string `json:"model,omitempty"`
}

// Defaults are the daemon's defaults for what a request leaves out.
type Defaults struct {
	Mode           string `json:"mode"`
	PassagesDevice int    `json:"passages_device"`
	PassagesCloud  int    `json:"passages_cloud"`
	MaxTokens      int    `json:"max_tokens"`
}

// Config configures the page.
type Config struct {
	// Guard wraps the status endpoint with the daemon's token check (the
	// page itself holds nothing private and loads without it).
	Guard  func(http.HandlerFunc) http.HandlerFunc
	Status func() Status
}

// contentSecurityPolicy lets the page run its own script and style and
// talk to its own origin only: no inline script, nothing from elsewhere,
// no framing by another site.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// Register adds the page (GET /), its assets and GET /v1/status to mux.
func Register(mux *http.ServeMux, cfg Config) {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is part of the binary
	}
	files := http.FileServerFS(sub)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		http.ServeFileFS(w, r, sub, "index.html")
	})
	mux.Handle("GET /assets/", http.StripPrefix("/assets", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secure(w)
		if strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r) // no listings
			return
		}
		files.ServeHTTP(w, r)
	})))
	mux.HandleFunc("GET /v1/status", cfg.Guard(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, cfg.Status())
	}))
}

// secure sets the headers every page response carries.
func secure(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	// A new binary may bring a new page: the browser asks again each
	// time (the assets are small, and answered 304 when unchanged).
	h.Set("Cache-Control", "no-cache")
}

// Weight is the page's size in bytes, uncompressed: the HTML, scripts,
// styles and images it loads.
func Weight() (int, error) {
	total := 0
	err := fs.WalkDir(assets, "assets", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(path)
		total += len(b)
		return err
	})
	return total, err
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(v)
}
