// Package weaviate is the cloud's scale-out retrieval backend: passages,
// their analyzed terms and their vectors in a Weaviate collection, spread
// over a cluster's shards and replicas. It speaks Weaviate's REST and
// GraphQL API over net/http, and searches over its gRPC API when given
// that port; ranking stays in package retrieval, which
// fuses the candidates this package fetches the same way for every
// backend.
package weaviate

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	pb "github.com/dragon-rag/dragon/proto/weaviate/v1"
)

// Errors, for errors.Is.
var (
	// ErrUnavailable: the engine could not be reached, timed out or said
	// it is not ready.
	ErrUnavailable = errors.New("weaviate: unavailable")
	// ErrAuth: the engine refused the API key.
	ErrAuth = errors.New("weaviate: not authorized")
	// ErrNoCollection: the collection does not exist.
	ErrNoCollection = errors.New("weaviate: no such collection")
	// ErrInvalid: the engine rejected the request (a vector of the wrong
	// dimension, a malformed object).
	ErrInvalid = errors.New("weaviate: invalid request")
)

// Config locates a collection.
type Config struct {
	// URL is the engine's base URL, http or https.
	URL string
	// Collection is the class name (Weaviate capitalizes the first
	// letter; we require it).
	Collection string
	// APIKey, if set, is sent as a bearer token.
	APIKey string
	// Timeout bounds each request (default 10s): a dead node is an error,
	// never a hang.
	Timeout time.Duration
	// TLS configures https (nil: the system roots); gRPC uses it too.
	TLS *tls.Config
	// GRPC is the engine's gRPC address (host:port). When set, searches
	// take Weaviate's binary search API rather than GraphQL: a node
	// spends less CPU on a request it need not parse as a query text (a
	// vector is 384 numbers written out) nor answer as JSON. The rest
	// (schema, writes, statistics) stays on HTTP.
	GRPC string
}

// ParseURL reads a --retrieval URL naming the engine, host and collection:
// weaviate://HOST:PORT/COLLECTION over http, weaviate+https://... over
// https. The API key comes from the URL's password
// (weaviate://:KEY@host/...) or, better kept off the command line, from
// $DRAGON_WEAVIATE_API_KEY. ?grpc=HOST:PORT (or ?grpc=:PORT on the URL's
// host) names the engine's gRPC port, which searches then use.
func ParseURL(raw string) (Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Config{}, fmt.Errorf("weaviate: bad URL %q: %w", raw, err)
	}
	scheme := "http"
	switch u.Scheme {
	case "weaviate":
	case "weaviate+https":
		scheme = "https"
	default:
		return Config{}, fmt.Errorf("weaviate: URL %q: scheme must be weaviate:// or weaviate+https://", raw)
	}
	if u.Host == "" {
		return Config{}, fmt.Errorf("weaviate: URL %q names no host", raw)
	}
	coll := strings.Trim(u.Path, "/")
	if err := validCollection(coll); err != nil {
		return Config{}, err
	}
	cfg := Config{URL: scheme + "://" + u.Host, Collection: coll, APIKey: os.Getenv("DRAGON_WEAVIATE_API_KEY")}
	if p, ok := u.User.Password(); ok {
		cfg.APIKey = p
	}
	if g := u.Query().Get("grpc"); g != "" {
		host, port, err := net.SplitHostPort(g)
		if err != nil || port == "" {
			return Config{}, fmt.Errorf("weaviate: URL %q: grpc must be HOST:PORT or :PORT", raw)
		}
		cfg.GRPC = net.JoinHostPort(cmp.Or(host, u.Hostname()), port)
	}
	if t := u.Query().Get("timeout"); t != "" {
		if cfg.Timeout, err = time.ParseDuration(t); err != nil {
			return Config{}, fmt.Errorf("weaviate: URL %q: timeout: %w", raw, err)
		}
	}
	return cfg, nil
}

// Open returns a client for a --retrieval URL (ParseURL).
func Open(raw string) (*Client, error) {
	cfg, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

var collectionName = regexp.MustCompile(`^[A-Z][A-Za-z0-9_]{0,230}$`)

func validCollection(name string) error {
	if !collectionName.MatchString(name) {
		return fmt.Errorf("weaviate: collection %q must start with a capital letter and hold only letters, digits and _", name)
	}
	return nil
}

// Client talks to one engine (any node of a cluster).
type Client struct {
	cfg  Config
	http *http.Client
	// conn and rpc are the gRPC connection, when cfg.GRPC names one.
	conn *grpc.ClientConn
	rpc  pb.WeaviateClient

	mu sync.Mutex
	// factor is the collection's replication factor, once read (0 until
	// then): it fixes the read consistency argument of GraphQL queries
	// (Weaviate offers it only on replicated collections) and the term
	// statistics class's replication.
	factor int
}

// New returns a client; it does not contact the engine.
func New(cfg Config) (*Client, error) {
	if err := validCollection(cfg.Collection); err != nil {
		return nil, err
	}
	if _, err := url.Parse(cfg.URL); err != nil || !strings.HasPrefix(cfg.URL, "http") {
		return nil, fmt.Errorf("weaviate: bad base URL %q", cfg.URL)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg.TLS
	tr.MaxIdleConnsPerHost = 16
	c := &Client{cfg: cfg, http: &http.Client{Transport: tr, Timeout: cfg.Timeout}}
	if cfg.GRPC != "" {
		conn, err := dialGRPC(cfg)
		if err != nil {
			return nil, err
		}
		c.conn, c.rpc = conn, pb.NewWeaviateClient(conn)
	}
	return c, nil
}

// String names the collection for messages (no key).
func (c *Client) String() string { return c.cfg.URL + "/" + c.cfg.Collection }

// Close releases idle connections and the gRPC connection.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
	if c.conn != nil {
		c.conn.Close()
	}
}

// do sends one request and decodes a JSON answer into out (if non-nil).
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("weaviate: encode %s: %w", path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.cfg.URL+path, rd)
	if err != nil {
		return fmt.Errorf("weaviate: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if c.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.cfg.APIKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("weaviate %s %s: %w", method, path, ctx.Err())
		}
		// Refused, reset, timed out, TLS failure: the engine is not there
		// for us.
		return fmt.Errorf("%w: %s: %v", ErrUnavailable, c.cfg.URL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("%w: %s: reading the answer: %v", ErrUnavailable, c.cfg.URL, err)
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("%w: %s refused the API key (%s)", ErrAuth, c.cfg.URL, resp.Status)
	case resp.StatusCode == http.StatusNotFound && strings.HasPrefix(path, "/v1/schema/"),
		// GraphQL on an engine with no collection at all.
		resp.StatusCode == http.StatusUnprocessableEntity && bytes.Contains(data, []byte("no schema is present")):
		return fmt.Errorf("%w: %s on %s", ErrNoCollection, c.cfg.Collection, c.cfg.URL)
	case resp.StatusCode == http.StatusServiceUnavailable || resp.StatusCode == http.StatusBadGateway || resp.StatusCode == http.StatusGatewayTimeout:
		return fmt.Errorf("%w: %s: %s", ErrUnavailable, c.cfg.URL, resp.Status)
	case (resp.StatusCode >= 500 || resp.StatusCode == http.StatusUnprocessableEntity) && clusterTransient.Match(data):
		return fmt.Errorf("%w: %s: %s: %s", ErrUnavailable, c.cfg.URL, resp.Status, errorText(data))
	case resp.StatusCode >= 400:
		return fmt.Errorf("%w: %s %s: %s: %s", ErrInvalid, method, path, resp.Status, errorText(data))
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("weaviate: decode %s answer: %w", path, err)
	}
	return nil
}

// clusterTransient matches a 500 that comes from the cluster's own
// plumbing rather than from the request: a node that restarted and whose
// consensus has not settled answers "failed to query leader: rpc error:
// code = Canceled ... the client connection is closing" for a few seconds
// (and a schema update relayed to the leader then, the same text as a 422).
var clusterTransient = regexp.MustCompile(`rpc error: code = (Unavailable|Canceled|DeadlineExceeded)|failed to query leader|leader not found`)

// errorText pulls Weaviate's messages out of an error body.
func errorText(body []byte) string {
	var e struct {
		Error []struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) == nil && len(e.Error) > 0 {
		var msgs []string
		for _, m := range e.Error {
			msgs = append(msgs, m.Message)
		}
		return strings.Join(msgs, "; ")
	}
	return strings.TrimSpace(string(body[:min(len(body), 500)]))
}

// readConsistency is the GraphQL argument that makes a read ask one
// replica: a replica that is down must not fail or stall the query (QUORUM,
// the default, waited out the whole timeout with one of three nodes down).
func (c *Client) readConsistency(ctx context.Context) (string, error) {
	factor, err := c.replicationFactor(ctx)
	if err != nil || factor < 2 {
		return "", err
	}
	return ", consistencyLevel: ONE", nil
}

// replicationFactor reads the collection's replication factor, once per
// client.
func (c *Client) replicationFactor(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.factor > 0 {
		return c.factor, nil
	}
	var class struct {
		Replication struct {
			Factor int `json:"factor"`
		} `json:"replicationConfig"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/schema/"+c.cfg.Collection, nil, &class); err != nil {
		return 0, err
	}
	c.factor = max(1, class.Replication.Factor)
	return c.factor, nil
}

// Ready reports whether the node answers and is ready, and, when searches
// take the gRPC port, whether that answers a search too (a wrong port
// would otherwise fail every query of a cloud that says it is ready).
func (c *Client) Ready(ctx context.Context) error {
	if err := c.do(ctx, http.MethodGet, "/v1/.well-known/ready", nil, nil); err != nil || c.rpc == nil {
		return err
	}
	_, err := c.search(ctx, &pb.SearchRequest{Limit: 1, Properties: &pb.PropertiesRequest{NonRefProperties: []string{"pid"}}})
	return err
}

// unknownClass is GraphQL's answer for a class the engine does not have.
var unknownClass = regexp.MustCompile(`^Cannot query field "([^"]+)" on type "(?:Get|Aggregate)ObjectsObj"`)

// graphQL runs a query; errors the engine reports in the answer are
// returned (with ErrNoCollection for an unknown class).
func (c *Client) graphQL(ctx context.Context, query string, out any) error {
	var resp struct {
		Data   json.RawMessage `json:"data"`
		Errors []struct {
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := c.do(ctx, http.MethodPost, "/v1/graphql", map[string]string{"query": query}, &resp); err != nil {
		return err
	}
	if len(resp.Errors) > 0 {
		msg := resp.Errors[0].Message
		if m := unknownClass.FindStringSubmatch(msg); m != nil {
			return fmt.Errorf("%w: %s on %s", ErrNoCollection, m[1], c.cfg.URL)
		}
		return fmt.Errorf("weaviate: query failed: %s", msg)
	}
	if err := json.Unmarshal(resp.Data, out); err != nil {
		return fmt.Errorf("weaviate: decode query answer: %w", err)
	}
	return nil
}
