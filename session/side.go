package session

import (
	"context"
	"errors"
	"log/slog"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/decoder"
	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/profiler"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// SideConfig is what a daemon generates with on its side of the pair.
type SideConfig struct {
	Model   engine.Model
	Decoder decoder.Options
	// Retriever searches this side's corpus; nil: no passages.
	Retriever Retriever
	Limits    Limits
	Defaults  Defaults
	// Fit is this side's decoding-latency fit, sent at handshake.
	Fit profiler.DecodeFit
	// HedgeBelow is Options.HedgeBelow for every generation.
	HedgeBelow float64
	// Metrics, when set, record every generation.
	Metrics *Metrics
	Log     *slog.Logger
}

// Open makes the decoder side generates with and the Hello it sends, and
// fills defaults.
func (c *SideConfig) Open(side aggregator.Side) (*decoder.Decoder, *dragonv1.Hello, error) {
	if c.Model == nil {
		return nil, nil, errors.New("session: no model")
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	dec, err := decoder.New(c.Model, c.Decoder)
	if err != nil {
		return nil, nil, err
	}
	return dec, NewHello(c.Model.Info(), side, c.Fit), nil
}

// Retrieve is this side's top-k passages for a request (none without a
// retriever): for its conversation's retrieval query (RetrievalQuery),
// among the passages its filter for this side lets through.
func (c *SideConfig) Retrieve(ctx context.Context, req Request, k int) ([]decoder.Passage, error) {
	if c.Retriever == nil {
		return nil, nil
	}
	return c.Retriever.Retrieve(ctx, RetrievalQuery(req), k, req.Filter)
}
