package wire_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dragon-rag/dragon/engine"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/wire"
)

func TestCheckHello(t *testing.T) {
	ours := wire.NewHello(engine.ModelInfo{Name: "SmolLM2-135M-Instruct", VocabSize: 49152, Fingerprint: "0123456789abcdef0123456789abcdef"}, dragonv1.Side_SIDE_CLOUD)
	peer := func(edit func(h *dragonv1.Hello)) *dragonv1.Hello {
		h := wire.NewHello(engine.ModelInfo{Name: "SmolLM2-135M-Instruct", VocabSize: 49152, Fingerprint: "0123456789abcdef0123456789abcdef"}, dragonv1.Side_SIDE_DEVICE)
		edit(h)
		return h
	}
	cases := []struct {
		name     string
		peer     *dragonv1.Hello
		code     codes.Code
		contains []string
	}{
		{"same model", peer(func(*dragonv1.Hello) {}), codes.OK, nil},
		{"other model", peer(func(h *dragonv1.Hello) {
			h.ModelName, h.ModelFingerprint = "gemma-3-270m", "ffffffffffffffffffffffff"
		}), codes.FailedPrecondition, []string{"model mismatch", `cloud running "SmolLM2-135M-Instruct"`, `device running "gemma-3-270m"`, "0123456789abcdef…"}},
		{"older protocol", peer(func(h *dragonv1.Hello) { h.ProtocolVersion = wire.ProtocolVersion - 1 }), codes.FailedPrecondition,
			[]string{"protocol version mismatch", fmt.Sprintf("v%d", wire.ProtocolVersion), fmt.Sprintf("v%d", wire.ProtocolVersion-1), "SmolLM2-135M-Instruct"}},
		{"vocabulary differs", peer(func(h *dragonv1.Hello) { h.VocabSize = 49153 }), codes.FailedPrecondition, []string{"49152", "49153"}},
		{"two devices", peer(func(h *dragonv1.Hello) { h.Side = dragonv1.Side_SIDE_CLOUD }), codes.FailedPrecondition, []string{"both peers are cloud"}},
		{"no fingerprint", peer(func(h *dragonv1.Hello) { h.ModelFingerprint = "" }), codes.InvalidArgument, []string{"no model fingerprint"}},
		{"no hello", nil, codes.InvalidArgument, []string{"first message must be a Hello"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := wire.CheckHello(ours, tc.peer)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			for _, s := range tc.contains {
				assert.Contains(t, status.Convert(err).Message(), s)
			}
		})
	}
}

func TestNewHelloFallsBackToPath(t *testing.T) {
	h := wire.NewHello(engine.ModelInfo{Path: "/models/x.gguf", Fingerprint: "fp"}, dragonv1.Side_SIDE_DEVICE)
	assert.Equal(t, "/models/x.gguf", h.GetModelName())
	assert.Equal(t, uint32(wire.ProtocolVersion), h.GetProtocolVersion())
}

func TestStatusHelpers(t *testing.T) {
	err := wire.InvalidArgument("sampling.top_p", "1.5 is not in [0, 1]")
	st := status.Convert(err)
	assert.Equal(t, codes.InvalidArgument, st.Code())
	assert.Equal(t, "invalid sampling.top_p: 1.5 is not in [0, 1]", st.Message())
	require.Len(t, st.Details(), 1)
	br, ok := st.Details()[0].(*errdetails.BadRequest)
	require.True(t, ok)
	assert.Equal(t, "sampling.top_p", br.GetFieldViolations()[0].GetField())

	err = wire.ResourceExhausted("concurrent generations", 8, 8, 2*time.Second)
	st = status.Convert(err)
	assert.Equal(t, codes.ResourceExhausted, st.Code())
	assert.Equal(t, "concurrent generations exhausted (8 of 8 in use); retry in 2s", st.Message())
	d, ok := wire.RetryAfter(err)
	assert.True(t, ok)
	assert.Equal(t, 2*time.Second, d)

	err = wire.ResourceExhausted("draft queue", 64, 64, 0)
	assert.Equal(t, "draft queue exhausted (64 of 64 in use); retry later", status.Convert(err).Message())
	_, ok = wire.RetryAfter(err)
	assert.False(t, ok)
}
