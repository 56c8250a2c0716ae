package device

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/session"
)

// FuzzChatRequest: whatever JSON a client posts to /v1/chat/completions,
// the device either refuses it (400, 404, or the request checks'
// InvalidArgument) or serves exactly what it asked for: every number it
// gave reaches the request unchanged, none wrapped or dropped.
func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"q"}]}`,
		`{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"q"}]}],"max_tokens":8,"temperature":0.5,"top_p":0.9,"seed":-3,"stop":["\n"]}`,
		`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":""},{"role":"user","content":"q"}],"mode":"tw","passages_device":3,"passages_cloud":0,"codec_top_p":0.8,"strategy":"cloud","confidence_temperature":0.25,"n":1}`,
		`{"model":"m","messages":[{"role":"user","content":"q"}],"max_completion_tokens":4294967297,"passages_device":4294967298}`,
	} {
		f.Add([]byte(s))
	}
	o := &OpenAI{model: "m"}
	lim := session.Limits{MaxTokens: 64, MaxPassages: 4, MaxPrompt: 200}
	def := session.Defaults{MaxTokens: 16, PassagesDevice: 2, PassagesCloud: 2, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION}
	f.Fuzz(func(t *testing.T, body []byte) {
		var req chatRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		r, err := parseChat(o, req, lim, def)
		if err != nil {
			var br badRequest
			var mnf modelNotFound
			if !errors.As(err, &br) && !errors.As(err, &mnf) {
				require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			}
			return
		}
		if n := req.MaxCompletionTokens; n != nil {
			require.Equal(t, *n, r.MaxTokens, "max_completion_tokens")
		} else if n := req.MaxTokens; n != nil {
			require.Equal(t, *n, r.MaxTokens, "max_tokens")
		}
		if n := req.PassagesDevice; n != nil && *n > 0 {
			require.Equal(t, *n, r.PassagesDevice, "passages_device")
		}
		if n := req.PassagesCloud; n != nil && *n > 0 {
			require.Equal(t, *n, r.PassagesCloud, "passages_cloud")
		}
		if v := req.Temperature; v != nil {
			require.InDelta(t, *v, r.Sampling.Temperature, 1e-6)
		}
		if v := req.CodecTopP; v != nil && *v != 0 {
			require.InDelta(t, *v, r.CodecTopP, 1e-6)
		}
	})
}

// parseChat is the chat endpoint's path from a decoded body to the
// request the device serves.
func parseChat(o *OpenAI, req chatRequest, lim session.Limits, def session.Defaults) (session.Request, error) {
	prompt, system, history, err := conversation(req.Messages)
	if err != nil {
		return session.Request{}, err
	}
	g, err := o.request(req.options, prompt, system)
	if err != nil {
		return session.Request{}, err
	}
	g.History = history
	return session.ParseGenerate(g, lim, def)
}
