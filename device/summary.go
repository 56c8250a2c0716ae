package device

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
	"github.com/dragon-rag/dragon/wire"
)

// SummaryJSON is a GenerateSummary as scripts read it, in one place so
// that `dragon ask --json` and the "dragon" object of OpenAI responses
// agree. Keys are the proto fields' names (durations as <name>_ms, float
// milliseconds) except those scripts already read under older names. The
// answer's text is left to each caller (OpenAI responses carry it as the
// message content), and so is the trace (`dragon ask --trace` writes it to
// a file; it is too large for a one-line summary).
type SummaryJSON struct {
	Mode             string  `json:"mode"`
	Finish           string  `json:"finish"`
	Tokens           uint32  `json:"tokens"`
	TTFTMS           float64 `json:"ttft_ms"`
	TokenMS          float64 `json:"per_token_ms"`
	TokenP50MS       float64 `json:"per_token_p50_ms"`
	TokenP95MS       float64 `json:"per_token_p95_ms"`
	TotalMS          float64 `json:"total_ms"`
	TokensPerSecond  float64 `json:"tokens_per_second"`
	AcceptanceDevice float64 `json:"acceptance_device"`
	AcceptanceCloud  float64 `json:"acceptance_cloud"`
	// Switches is the name `dragon ask --json` has always printed,
	// AggregatorSwitches the one OpenAI responses have; both stay for the
	// scripts that read either.
	Switches                       uint32 `json:"switches"`
	AggregatorSwitches             uint32 `json:"aggregator_switches"`
	StaleDrafts                    uint64 `json:"stale_drafts"`
	BytesSent                      uint64 `json:"bytes_sent"`
	BytesReceived                  uint64 `json:"bytes_received"`
	StepsDevice                    uint64 `json:"steps_aggregated_device"`
	StepsCloud                     uint64 `json:"steps_aggregated_cloud"`
	PassagesDevice                 uint32 `json:"passages_device"`
	PassagesCloud                  uint32 `json:"passages_cloud"`
	ForwardPassesDevice            uint64 `json:"forward_passes_device"`
	LocalDraftTokensAcceptedDevice uint64 `json:"local_draft_tokens_accepted_device"`
	SecondChoiceDevice             uint64 `json:"second_choice_device"`
	SecondChoiceCloud              uint64 `json:"second_choice_cloud"`
	RejectedDevice                 uint64 `json:"rejected_device"`
	RejectedCloud                  uint64 `json:"rejected_cloud"`
	// Per answer token: what the link costs (issue 42's counters). Up is
	// device to cloud.
	RejectedPerTokenDevice float64 `json:"rejected_per_token_device"`
	RejectedPerTokenCloud  float64 `json:"rejected_per_token_cloud"`
	BytesUpPerToken        float64 `json:"bytes_up_per_token"`
	BytesDownPerToken      float64 `json:"bytes_down_per_token"`
	// Counts per draft-probability threshold (0.2, 0.3, 0.5, 0.7), for sizing
	// hedges: decided drafts below it and the second-choice rejections
	// among them.
	LowProbDraftsDevice []uint64 `json:"low_prob_drafts_device"`
	LowProbDraftsCloud  []uint64 `json:"low_prob_drafts_cloud"`
	LowProbCaughtDevice []uint64 `json:"low_prob_caught_device"`
	LowProbCaughtCloud  []uint64 `json:"low_prob_caught_cloud"`
	// Hedged drafts each side declared, and rejections that adopted one.
	HedgesDevice           uint64 `json:"hedges_device"`
	HedgesCloud            uint64 `json:"hedges_cloud"`
	HedgeHitsDevice        uint64 `json:"hedge_hits_device"`
	HedgeHitsCloud         uint64 `json:"hedge_hits_cloud"`
	Fallback               bool   `json:"fallback"`
	FallbackStep           uint32 `json:"fallback_step"`
	FallbackReason         string `json:"fallback_reason"`
	PassagesRestoredDevice uint32 `json:"passages_restored_device"`
	PassagesRestoredCloud  uint32 `json:"passages_restored_cloud"`
	// SourcesPartial: the answer's sources (beside this summary) lack some
	// passages it used.
	SourcesPartial bool `json:"sources_partial"`
}

// SourceJSON is a dragon.v1.Source as scripts and the OpenAI API read it:
// one entry of an answer's sources, the same keys everywhere (the proto
// fields' names). LogLikelihood is absent where the side does not know
// the passage's evidence.
type SourceJSON struct {
	Side          string            `json:"side"`
	DocumentID    string            `json:"document_id,omitempty"`
	PassageID     uint64            `json:"passage_id,omitempty"`
	Source        string            `json:"source"`
	Title         string            `json:"title"`
	Metadata      map[string]string `json:"metadata,omitempty"`
	Start         uint64            `json:"start"`
	End           uint64            `json:"end"`
	Score         float64           `json:"score"`
	Weight        float64           `json:"weight"`
	Share         float64           `json:"share"`
	LogLikelihood *float64          `json:"log_likelihood,omitempty"`
	Excerpt       string            `json:"excerpt,omitempty"`
	ClosedBook    bool              `json:"closed_book,omitempty"`
}

// NewSourcesJSON maps a summary's sources to their JSON form (an empty
// list, not null, when there are none).
func NewSourcesJSON(s *dragonv1.GenerateSummary) []SourceJSON {
	out := make([]SourceJSON, 0, len(s.GetSources()))
	for _, e := range s.GetSources() {
		j := SourceJSON{
			Side: wire.SideName(e.GetSide()), DocumentID: e.GetDocumentId(), PassageID: e.GetPassageId(), Source: e.GetSource(),
			Title: e.GetTitle(), Metadata: e.GetMetadata(), Start: e.GetStart(), End: e.GetEnd(), Score: e.GetScore(),
			Weight: e.GetWeight(), Share: e.GetShare(), Excerpt: e.GetExcerpt(), ClosedBook: e.GetClosedBook(),
		}
		if e.GetHasEvidence() {
			ll := e.GetLogLikelihood()
			j.LogLikelihood = &ll
		}
		out = append(out, j)
	}
	return out
}

// NewSummaryJSON maps s to its JSON form.
func NewSummaryJSON(s *dragonv1.GenerateSummary) SummaryJSON {
	ms := func(d *durationpb.Duration) float64 { return float64(d.AsDuration()) / float64(time.Millisecond) }
	perToken := func(n uint64) float64 {
		if s.GetTokens() == 0 {
			return 0
		}
		return float64(n) / float64(s.GetTokens())
	}
	return SummaryJSON{
		Mode: session.ModeName(s.GetMode()), Finish: finishReasonName(s.GetFinishReason()), Tokens: s.GetTokens(),
		TTFTMS: ms(s.GetTtft()), TokenMS: ms(s.GetTokenLatencyMean()), TokenP50MS: ms(s.GetTokenLatencyP50()),
		TokenP95MS: ms(s.GetTokenLatencyP95()), TotalMS: ms(s.GetTotal()), TokensPerSecond: s.GetTokensPerSecond(),
		AcceptanceDevice: s.GetAcceptanceRateDevice(), AcceptanceCloud: s.GetAcceptanceRateCloud(),
		Switches: s.GetAggregatorSwitches(), AggregatorSwitches: s.GetAggregatorSwitches(),
		StaleDrafts: s.GetStaleDrafts(), BytesSent: s.GetBytesSent(), BytesReceived: s.GetBytesReceived(),
		StepsDevice: s.GetStepsAggregatedDevice(), StepsCloud: s.GetStepsAggregatedCloud(),
		PassagesDevice: s.GetPassagesDevice(), PassagesCloud: s.GetPassagesCloud(),
		ForwardPassesDevice: s.GetForwardPassesDevice(), LocalDraftTokensAcceptedDevice: s.GetLocalDraftTokensAcceptedDevice(),
		SecondChoiceDevice: s.GetSecondChoiceDevice(), SecondChoiceCloud: s.GetSecondChoiceCloud(),
		RejectedDevice: s.GetRejectedDevice(), RejectedCloud: s.GetRejectedCloud(),
		RejectedPerTokenDevice: perToken(s.GetRejectedDevice()), RejectedPerTokenCloud: perToken(s.GetRejectedCloud()),
		BytesUpPerToken: perToken(s.GetBytesSent()), BytesDownPerToken: perToken(s.GetBytesReceived()),
		LowProbDraftsDevice: s.GetLowProbDraftsDevice(), LowProbDraftsCloud: s.GetLowProbDraftsCloud(),
		LowProbCaughtDevice: s.GetLowProbCaughtDevice(), LowProbCaughtCloud: s.GetLowProbCaughtCloud(),
		HedgesDevice: s.GetHedgesDevice(), HedgesCloud: s.GetHedgesCloud(), HedgeHitsDevice: s.GetHedgeHitsDevice(), HedgeHitsCloud: s.GetHedgeHitsCloud(),
		Fallback: s.GetFallback(), FallbackStep: s.GetFallbackStep(), FallbackReason: s.GetFallbackReason(),
		PassagesRestoredDevice: s.GetPassagesRestoredDevice(), PassagesRestoredCloud: s.GetPassagesRestoredCloud(),
		SourcesPartial: s.GetSourcesPartial(),
	}
}

// finishReasonName names every finish reason, unlike finishName, which
// folds them into the two the OpenAI API knows.
func finishReasonName(f dragonv1.FinishReason) string {
	switch f {
	case dragonv1.FinishReason_FINISH_REASON_STOP:
		return "stop"
	case dragonv1.FinishReason_FINISH_REASON_LENGTH:
		return "length"
	case dragonv1.FinishReason_FINISH_REASON_CONTEXT_FULL:
		return "context_full"
	case dragonv1.FinishReason_FINISH_REASON_CANCELLED:
		return "cancelled"
	}
	return "unknown"
}

// ProgressJSON is a dragon.v1.Progress in the OpenAI stream's
// dragon_progress events.
type ProgressJSON struct {
	// Phase is "queued", "retrieving" or "prefilling".
	Phase          string `json:"phase"`
	PassagesDevice uint32 `json:"passages_device,omitempty"`
	PassagesCloud  uint32 `json:"passages_cloud,omitempty"`
	QueuePosition  uint32 `json:"queue_position,omitempty"`
}

// NewProgressJSON maps p to its JSON form.
func NewProgressJSON(p *dragonv1.Progress) ProgressJSON {
	return ProgressJSON{
		Phase:          strings.ToLower(strings.TrimPrefix(p.GetPhase().String(), "PROGRESS_PHASE_")),
		PassagesDevice: p.GetPassagesDevice(), PassagesCloud: p.GetPassagesCloud(), QueuePosition: p.GetQueuePosition(),
	}
}
