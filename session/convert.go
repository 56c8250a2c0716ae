package session

import (
	"fmt"

	"github.com/dragon-rag/dragon/aggregator"
	"github.com/dragon-rag/dragon/codec"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Conversions between the aggregator's types and the wire's. Drafts travel
// as their codec payloads; the receiving side decodes each payload into the
// distribution the aggregator uses.

func toSide(s aggregator.Side) dragonv1.Side {
	if s == aggregator.Cloud {
		return dragonv1.Side_SIDE_CLOUD
	}
	return dragonv1.Side_SIDE_DEVICE
}

func fromSide(s dragonv1.Side) (aggregator.Side, error) {
	switch s {
	case dragonv1.Side_SIDE_DEVICE:
		return aggregator.Device, nil
	case dragonv1.Side_SIDE_CLOUD:
		return aggregator.Cloud, nil
	}
	return 0, fmt.Errorf("%w: unknown side %v", aggregator.ErrProtocol, s)
}

func toDraft(d *aggregator.Draft) *dragonv1.Draft {
	w := &dragonv1.Draft{
		Step: d.Step(), Epoch: d.Epoch(), Token: d.Token(), Distribution: d.Payload(),
		LogRelevanceMass: d.LogMass(), DecodeTimeUs: d.Meta.DecodeMicros, Side: toSide(d.Side()),
		Context: d.Meta.Context, Moved: d.Meta.Moved, Fork: d.WireFork(),
	}
	if tok, ok := d.Hedge(); ok {
		w.Hedge = &tok
	}
	return w
}

func toDrafts(ds []aggregator.Draft) []*dragonv1.Draft {
	out := make([]*dragonv1.Draft, len(ds))
	for i := range ds {
		out[i] = toDraft(&ds[i])
	}
	return out
}

func fromDrafts(dec *codec.Decoder, ps []*dragonv1.Draft) ([]aggregator.Draft, error) {
	out := make([]aggregator.Draft, 0, len(ps))
	for _, p := range ps {
		side, err := fromSide(p.GetSide())
		if err != nil {
			return nil, err
		}
		d, err := aggregator.DecodeDraft(dec, aggregator.WireDraft{
			Side: side, Step: p.GetStep(), Epoch: p.GetEpoch(), Token: p.GetToken(), Payload: p.GetDistribution(),
			LogMass: p.GetLogRelevanceMass(), Meta: aggregator.Meta{DecodeMicros: p.GetDecodeTimeUs(), Context: p.GetContext(), Moved: p.GetMoved()},
			Fork: p.GetFork(), Hedge: p.GetHedge(), Hedged: p.Hedge != nil,
		})
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

func toVerdict(v aggregator.Verdict) *dragonv1.Verdict {
	return &dragonv1.Verdict{
		Step: v.Step, TargetToken: v.Target,
		AcceptDevice: v.Accept[0], AcceptCloud: v.Accept[1],
		EpochDevice: v.Epoch[0], EpochCloud: v.Epoch[1],
		NextEpochDevice: v.NextEpoch[0], NextEpochCloud: v.NextEpoch[1],
		ExpectedDevice: v.Expected[0], ExpectedCloud: v.Expected[1],
		MovedDevice: v.Moved[0], MovedCloud: v.Moved[1],
		HedgedDevice: v.Hedged[0], HedgedCloud: v.Hedged[1],
	}
}

func fromVerdict(p *dragonv1.Verdict) aggregator.Verdict {
	return aggregator.Verdict{
		Step: p.GetStep(), Target: p.GetTargetToken(),
		Accept:    [2]bool{p.GetAcceptDevice(), p.GetAcceptCloud()},
		Epoch:     [2]uint32{p.GetEpochDevice(), p.GetEpochCloud()},
		NextEpoch: [2]uint32{p.GetNextEpochDevice(), p.GetNextEpochCloud()},
		Expected:  [2]float64{p.GetExpectedDevice(), p.GetExpectedCloud()},
		Moved:     [2]bool{p.GetMovedDevice(), p.GetMovedCloud()},
		Hedged:    [2]bool{p.GetHedgedDevice(), p.GetHedgedCloud()},
	}
}

func toHandover(id uint64, h aggregator.Handover) *dragonv1.Handover {
	return &dragonv1.Handover{
		SessionId: id, NextStep: h.NextStep, Queue: toDrafts(h.Queue),
		EpochDevice: h.Epochs[0], EpochCloud: h.Epochs[1],
	}
}

func fromHandover(dec *codec.Decoder, p *dragonv1.Handover) (aggregator.Handover, error) {
	q, err := fromDrafts(dec, p.GetQueue())
	if err != nil {
		return aggregator.Handover{}, err
	}
	return aggregator.Handover{NextStep: p.GetNextStep(), Epochs: [2]uint32{p.GetEpochDevice(), p.GetEpochCloud()}, Queue: q}, nil
}

// msgDrafts carries drafts and how many of the sender's passages began
// from its KV cache (a count, for the answer's summary).
func msgDrafts(id uint64, ds []aggregator.Draft, restored int) *dragonv1.PeerMessage {
	return &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Drafts{Drafts: &dragonv1.Drafts{SessionId: id, Drafts: toDrafts(ds), PassagesRestored: uint32(restored)}}}
}

func msgVerdicts(id uint64, vs []aggregator.Verdict) *dragonv1.PeerMessage {
	out := make([]*dragonv1.Verdict, len(vs))
	for i, v := range vs {
		out[i] = toVerdict(v)
	}
	return &dragonv1.PeerMessage{Kind: &dragonv1.PeerMessage_Verdicts{Verdicts: &dragonv1.Verdicts{SessionId: id, Verdicts: out}}}
}
