package weaviate

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/dragon-rag/dragon/proto/weaviate/v1"
)

// dialGRPC opens (lazily: nothing is sent before the first call) the
// connection searches take when the config names a gRPC address. It uses
// TLS exactly when the HTTP URL does.
func dialGRPC(cfg Config) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if strings.HasPrefix(cfg.URL, "https://") {
		tc := cfg.TLS
		if tc == nil {
			tc = &tls.Config{MinVersion: tls.VersionTLS12}
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(cfg.GRPC, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("weaviate: gRPC address %q: %w", cfg.GRPC, err)
	}
	return conn, nil
}

// search runs one request over gRPC, bounded by the client's timeout.
func (c *Client) search(ctx context.Context, req *pb.SearchRequest) ([]*pb.SearchResult, error) {
	factor, err := c.replicationFactor(ctx)
	if err != nil {
		return nil, err
	}
	if factor >= 2 {
		// One replica answers, as for GraphQL reads (readConsistency).
		req.ConsistencyLevel = pb.ConsistencyLevel_CONSISTENCY_LEVEL_ONE.Enum()
	}
	req.Collection, req.Uses_127Api = c.cfg.Collection, true
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	if c.cfg.APIKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.cfg.APIKey)
	}
	rep, err := c.rpc.Search(ctx, req)
	if err != nil {
		return nil, c.grpcError(ctx, err)
	}
	return rep.GetResults(), nil
}

// grpcError maps a failed call onto the package's errors, as do does for
// HTTP.
func (c *Client) grpcError(ctx context.Context, err error) error {
	st, _ := status.FromError(err)
	switch {
	case ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("weaviate search: %w", ctx.Err())
	// Weaviate 1.35 answers a bad key with code Unknown and this text.
	case st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied || strings.Contains(st.Message(), "unauthorized"):
		return fmt.Errorf("%w: %s refused the API key (%s)", ErrAuth, c.cfg.GRPC, st.Message())
	case st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded || clusterTransient.MatchString(st.Message()):
		return fmt.Errorf("%w: %s: %s", ErrUnavailable, c.cfg.GRPC, st.Message())
	case strings.Contains(st.Message(), "could not find class"):
		return fmt.Errorf("%w: %s on %s", ErrNoCollection, c.cfg.Collection, c.cfg.GRPC)
	}
	return fmt.Errorf("%w: search: %s: %s", ErrInvalid, st.Code(), st.Message())
}

func (c *Client) lexicalGRPC(ctx context.Context, terms []string, n int) ([]Candidate, error) {
	rs, err := c.search(ctx, &pb.SearchRequest{
		Limit:      uint32(n),
		Bm25Search: &pb.BM25{Query: strings.Join(terms, " "), Properties: []string{"terms"}},
		Properties: &pb.PropertiesRequest{NonRefProperties: []string{"pid", "terms"}},
		Metadata:   &pb.MetadataRequest{Score: true},
	})
	if err != nil {
		return nil, err
	}
	return c.grpcCandidates(rs, func(m *pb.MetadataResult) (float64, bool) { return float64(m.GetScore()), m.GetScorePresent() })
}

func (c *Client) nearestGRPC(ctx context.Context, v []float32, n int) ([]Candidate, error) {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	rs, err := c.search(ctx, &pb.SearchRequest{
		Limit:      uint32(n),
		NearVector: &pb.NearVector{Vectors: []*pb.Vectors{{VectorBytes: b, Type: pb.Vectors_VECTOR_TYPE_SINGLE_FP32}}},
		Properties: &pb.PropertiesRequest{NonRefProperties: []string{"pid"}},
		Metadata:   &pb.MetadataRequest{Distance: true},
	})
	if err != nil {
		return nil, err
	}
	return c.grpcCandidates(rs, func(m *pb.MetadataResult) (float64, bool) {
		return 1 - float64(m.GetDistance()), m.GetDistancePresent()
	})
}

func (c *Client) grpcCandidates(rs []*pb.SearchResult, score func(*pb.MetadataResult) (float64, bool)) ([]Candidate, error) {
	out := make([]Candidate, 0, len(rs))
	for _, r := range rs {
		o, err := grpcProps(r).object(c.cfg.Collection)
		if err != nil {
			return nil, err
		}
		s, ok := score(r.GetMetadata())
		if !ok {
			return nil, fmt.Errorf("weaviate: no score for %x in %s", o.PID, c.cfg.Collection)
		}
		out = append(out, Candidate{Object: o, Score: s})
	}
	return out, nil
}

// byPIDsGRPC is byPIDs's request over gRPC.
func (c *Client) byPIDsGRPC(ctx context.Context, pids []uint64, fields []string) ([]wireProps, error) {
	rs, err := c.search(ctx, &pb.SearchRequest{
		Limit: uint32(len(pids)),
		Filters: &pb.Filters{
			Operator:  pb.Filters_OPERATOR_CONTAINS_ANY,
			Target:    &pb.FilterTarget{Target: &pb.FilterTarget_Property{Property: "pid"}},
			TestValue: &pb.Filters_ValueTextArray{ValueTextArray: &pb.TextArray{Values: pidTexts(pids)}},
		},
		Properties: &pb.PropertiesRequest{NonRefProperties: fields},
	})
	if err != nil {
		return nil, err
	}
	rows := make([]wireProps, len(rs))
	for i, r := range rs {
		rows[i] = grpcProps(r)
	}
	return rows, nil
}

// grpcProps reads a result's properties into the GraphQL path's shape.
func grpcProps(r *pb.SearchResult) wireProps {
	f := r.GetProperties().GetNonRefProps().GetFields()
	return wireProps{
		PID: f["pid"].GetTextValue(), Source: f["source"].GetTextValue(),
		Start: int(f["start"].GetIntValue()), End: int(f["end"].GetIntValue()), Tokens: int(f["tokens"].GetIntValue()),
		Text: f["text"].GetTextValue(), Meta: f["meta"].GetTextValue(), Terms: f["terms"].GetTextValue(),
	}
}
