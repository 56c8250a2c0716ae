package wire

import (
	"fmt"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// Decision is what the epoch filter says about an incoming draft.
type Decision uint8

const (
	// Verify: the draft belongs to its side's current epoch.
	Verify Decision = 1 + iota
	// DropStale: the draft was sent before its side rolled back; it must be
	// dropped and never verified (its distribution conditions on a token
	// that was rejected).
	DropStale
)

func (d Decision) String() string {
	switch d {
	case Verify:
		return "verify"
	case DropStale:
		return "drop-stale"
	}
	return fmt.Sprintf("Decision(%d)", uint8(d))
}

// EpochFilter tracks each side's current epoch, as the aggregator knows it,
// and sorts incoming drafts into current and stale. A side's epoch grows by
// one on every rollback; drafts already in flight then carry the old epoch.
// Without the filter such a draft, for step s, could be paired with the
// re-drafted step s of the other epoch and verified against the wrong
// prefix (a defect of the public DRAGON code).
//
// It is pure (no clock, no I/O, no goroutines) and not safe for concurrent
// use. The zero value starts both sides at epoch 0 from step 0.
type EpochFilter struct {
	epoch   [numSides]uint32
	from    [numSides]uint64 // first step the current epoch drafts
	dropped [numSides]uint64
}

const numSides = 3 // indexed by dragonv1.Side; 0 is unused

func sideIndex(side dragonv1.Side) (int, error) {
	switch side {
	case dragonv1.Side_SIDE_DEVICE, dragonv1.Side_SIDE_CLOUD:
		return int(side), nil
	}
	return 0, fmt.Errorf("wire: draft from unknown side %v", side)
}

// Admit decides about a draft from side for step at epoch, counting it if
// stale. An error means the peer broke the protocol: an epoch newer than
// any the aggregator issued, or a draft of the current epoch for a step
// before that epoch began.
func (f *EpochFilter) Admit(side dragonv1.Side, step uint64, epoch uint32) (Decision, error) {
	i, err := sideIndex(side)
	if err != nil {
		return 0, err
	}
	switch cur := f.epoch[i]; {
	case epoch < cur:
		f.dropped[i]++
		return DropStale, nil
	case epoch > cur:
		return 0, fmt.Errorf("wire: %v draft for step %d has epoch %d, ahead of the current %d", side, step, epoch, cur)
	case step < f.from[i]:
		return 0, fmt.Errorf("wire: %v draft for step %d in epoch %d, which starts at step %d", side, step, epoch, f.from[i])
	}
	return Verify, nil
}

// AdmitDraft is Admit for a protobuf draft.
func (f *EpochFilter) AdmitDraft(d *dragonv1.Draft) (Decision, error) {
	return f.Admit(d.GetSide(), d.GetStep(), d.GetEpoch())
}

// Rollback records that side rejected a draft and drafts again, under
// epoch, from step from (the step after the rejected one). Epochs only
// grow.
func (f *EpochFilter) Rollback(side dragonv1.Side, epoch uint32, from uint64) error {
	i, err := sideIndex(side)
	if err != nil {
		return err
	}
	if epoch <= f.epoch[i] {
		return fmt.Errorf("wire: %v rollback to epoch %d, not after the current %d", side, epoch, f.epoch[i])
	}
	f.epoch[i], f.from[i] = epoch, from
	return nil
}

// Restore sets the epochs carried by an aggregator Handover. The step each
// epoch began at is not carried, so drafts are checked by epoch alone until
// the next rollback. Drop counts are kept: they belong to this side's
// statistics.
func (f *EpochFilter) Restore(h *dragonv1.Handover) {
	f.epoch[dragonv1.Side_SIDE_DEVICE] = h.GetEpochDevice()
	f.epoch[dragonv1.Side_SIDE_CLOUD] = h.GetEpochCloud()
	f.from = [numSides]uint64{}
}

// Epoch is side's current epoch (0 for an unknown side).
func (f *EpochFilter) Epoch(side dragonv1.Side) uint32 {
	i, err := sideIndex(side)
	if err != nil {
		return 0
	}
	return f.epoch[i]
}

// Dropped is how many of side's drafts were dropped as stale.
func (f *EpochFilter) Dropped(side dragonv1.Side) uint64 {
	i, err := sideIndex(side)
	if err != nil {
		return 0
	}
	return f.dropped[i]
}
