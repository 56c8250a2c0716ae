// Package wire holds what both daemons need around the dragon.v1 protocol:
// the handshake check, gRPC server and client options (keepalive, message
// size, TLS and mutual TLS, bearer tokens) and status errors with clear
// messages. Epochs and stale drafts belong to package aggregator.
//
// Everything here is either pure or builds options; nothing starts a
// goroutine or opens a socket.
package wire

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// ProtocolVersion is the dragon.v1 peer protocol revision this build
// speaks. Bump it on any change a peer built from older code would
// misread.
const ProtocolVersion = 6

// NewHello is the Hello a side sends for its loaded model.
func NewHello(info engine.ModelInfo, side dragonv1.Side) *dragonv1.Hello {
	return &dragonv1.Hello{
		ProtocolVersion:  ProtocolVersion,
		ModelFingerprint: info.Fingerprint,
		ModelName:        modelName(info),
		VocabSize:        uint32(info.VocabSize),
		Side:             side,
	}
}

func modelName(info engine.ModelInfo) string {
	if info.Name != "" {
		return info.Name
	}
	return info.Path
}

// CheckHello decides whether we (ours) can generate together with the peer
// that sent peer. Distributions can be mixed only over the same vocabulary,
// so a different model fingerprint or vocabulary size, like a different
// protocol version, is refused with FailedPrecondition; the message names
// both models so an operator can tell which side to change. A malformed
// Hello is InvalidArgument.
func CheckHello(ours, peer *dragonv1.Hello) error {
	if peer == nil {
		return status.Error(codes.InvalidArgument, "handshake: the first message must be a Hello")
	}
	if peer.GetModelFingerprint() == "" {
		return status.Errorf(codes.InvalidArgument, "handshake: peer %s sent no model fingerprint", describe(peer))
	}
	if peer.GetProtocolVersion() != ours.GetProtocolVersion() {
		return status.Errorf(codes.FailedPrecondition,
			"handshake: protocol version mismatch: this %s speaks dragon protocol v%d, peer %s speaks v%d; run the same dragon release on both sides",
			describe(ours), ours.GetProtocolVersion(), describe(peer), peer.GetProtocolVersion())
	}
	if peer.GetModelFingerprint() != ours.GetModelFingerprint() {
		return status.Errorf(codes.FailedPrecondition,
			"handshake: model mismatch: this %s (fingerprint %s) and peer %s (fingerprint %s) have different tokenizers or vocabularies, so their distributions cannot be mixed; load models of the same family on both sides",
			describe(ours), short(ours.GetModelFingerprint()), describe(peer), short(peer.GetModelFingerprint()))
	}
	if ours.GetVocabSize() != 0 && peer.GetVocabSize() != 0 && peer.GetVocabSize() != ours.GetVocabSize() {
		return status.Errorf(codes.FailedPrecondition,
			"handshake: vocabulary mismatch: this %s has %d tokens, peer %s has %d",
			describe(ours), ours.GetVocabSize(), describe(peer), peer.GetVocabSize())
	}
	if s := peer.GetSide(); s != dragonv1.Side_SIDE_UNSPECIFIED && s == ours.GetSide() {
		return status.Errorf(codes.FailedPrecondition, "handshake: both peers are %s; one device and one cloud daemon are needed", SideName(s))
	}
	return nil
}

// describe renders a Hello's side and model for error messages, e.g.
// `cloud running "SmolLM2 135M Instruct"`.
func describe(h *dragonv1.Hello) string {
	name := h.GetModelName()
	if name == "" {
		name = "an unnamed model"
	} else {
		name = fmt.Sprintf("%q", name)
	}
	if s := h.GetSide(); s != dragonv1.Side_SIDE_UNSPECIFIED {
		return SideName(s) + " running " + name
	}
	return "side running " + name
}

// SideName is how people read a side: "device" or "cloud" (the enum's name
// for any other value).
func SideName(s dragonv1.Side) string {
	switch s {
	case dragonv1.Side_SIDE_DEVICE:
		return "device"
	case dragonv1.Side_SIDE_CLOUD:
		return "cloud"
	}
	return s.String()
}

// short trims a fingerprint (usually a long hex digest) for messages.
func short(fp string) string {
	if len(fp) > 16 {
		return fp[:16] + "…"
	}
	return fp
}
