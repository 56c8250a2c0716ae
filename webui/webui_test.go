package webui

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// guard is a stand-in for the daemon's token check.
func guard(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer t" {
			http.Error(w, `{"error":{"message":"token"}}`, http.StatusUnauthorized)
			return
		}
		h(w, r)
	}
}

func server(t *testing.T) *httptest.Server {
	mux := http.NewServeMux()
	Register(mux, Config{Guard: guard, Status: func() Status {
		return Status{DeviceModel: "m", Cloud: CloudStatus{Configured: true, State: "ready"}, Modes: []string{"dragon"}}
	}})
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	return hs
}

// The page and its assets load without the token, each with the
// security headers; the page loads only its own assets; the status needs
// the token.
func TestPageAndAssets(t *testing.T) {
	hs := server(t)
	get := func(path string, header ...string) (*http.Response, string) {
		req, err := http.NewRequest("GET", hs.URL+path, nil)
		require.NoError(t, err)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(b)
	}
	resp, html := get("/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	assert.Equal(t, contentSecurityPolicy, resp.Header.Get("Content-Security-Policy"))
	assert.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"))
	assert.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))

	// Every asset the page names is served, from this origin.
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(html, -1)
	require.NotEmpty(t, refs)
	for _, m := range refs {
		ref := m[1]
		if strings.HasPrefix(ref, "#") {
			continue
		}
		assert.True(t, strings.HasPrefix(ref, "/assets/"), "the page loads %s from elsewhere", ref)
		r, body := get(ref)
		assert.Equal(t, http.StatusOK, r.StatusCode, ref)
		assert.NotEmpty(t, body, ref)
		assert.Equal(t, contentSecurityPolicy, r.Header.Get("Content-Security-Policy"), ref)
	}
	assert.NotContains(t, html, "<script>", "no inline script: the policy forbids it")
	assert.NotContains(t, html, "style=", "no inline style")

	r, _ := get("/assets/")
	assert.Equal(t, http.StatusNotFound, r.StatusCode, "no listing")
	r, _ = get("/assets/nothing.js")
	assert.Equal(t, http.StatusNotFound, r.StatusCode)

	r, _ = get("/v1/status")
	assert.Equal(t, http.StatusUnauthorized, r.StatusCode)
	r, body := get("/v1/status", "Authorization", "Bearer t")
	require.Equal(t, http.StatusOK, r.StatusCode)
	var st Status
	require.NoError(t, json.Unmarshal([]byte(body), &st))
	assert.Equal(t, "m", st.DeviceModel)
	assert.True(t, st.Cloud.Configured)
}

// The page's weight stays within issue 56's 300 KB.
func TestWeight(t *testing.T) {
	n, err := Weight()
	require.NoError(t, err)
	assert.Positive(t, n)
	assert.LessOrEqual(t, n, 300<<10)
}
