package specdec

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOptionsValidate(t *testing.T) {
	require.NoError(t, DefaultOptions().Validate())
	for name, mod := range map[string]func(*Options){
		"no draft":          func(o *Options) { o.MaxDraft = 0 },
		"negative budget":   func(o *Options) { o.TreeBudget = -1 },
		"no branching":      func(o *Options) { o.Branching = 0 },
		"negative reuse":    func(o *Options) { o.ReuseBudget = -1 },
		"probability > 1":   func(o *Options) { o.Calibrate.MinProb = 2 },
		"no depth":          func(o *Options) { o.Calibrate.MaxDepth = 0 },
		"no order":          func(o *Options) { o.Calibrate.MaxOrder = 0 },
		"zero calib weight": func(o *Options) { o.Calibrate.Weight = 0 },
	} {
		o := DefaultOptions()
		mod(&o)
		require.ErrorIs(t, o.Validate(), ErrInvalid, name)
		_, err := NewDrafter(o, NewAcceptance(0.5))
		require.ErrorIs(t, err, ErrInvalid, name)
	}
}

func TestDisabledDrafterProposesNothing(t *testing.T) {
	d := newTestDrafter(t, func(o *Options) { o.Enabled = false })
	d.AddDocument(toks("abcabc"))
	d.StartAnswer(toks("ab"))
	d.Verified(toks("Xab"), toks("Qabz"))
	require.Empty(t, d.Draft().Tokens)
	tr := BuildTree(d.TreeSource(), 'b', linearCost(0.01, 0), 8, 8, 8)
	require.Zero(t, tr.Size())
}

func TestStats(t *testing.T) {
	var s Stats
	require.Zero(t, s.MeanAccepted())
	s.Record(0, 0, false)
	s.Record(4, 3, false)
	s.Record(2, 0, true)
	require.Equal(t, Stats{Steps: 3, Drafts: 2, DraftedTokens: 6, AcceptedTokens: 3, ReusedDrafts: 1}, s)
	require.InDelta(t, 1.5, s.MeanAccepted(), 1e-12)
}

// spec stays pure: the standard library and engine (for Token) only, so
// no cgo, gRPC or runtime pulls in.
func TestImportsStayPure(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		require.NoError(t, err)
		ast, err := parser.ParseFile(fset, f, src, parser.ImportsOnly)
		require.NoError(t, err)
		for _, imp := range ast.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			require.NoError(t, err)
			std := !strings.Contains(strings.Split(p, "/")[0], ".") && p != "C"
			require.True(t, std || p == "github.com/dragon-rag/dragon/engine", "%s imports %s", f, p)
		}
	}
}
