package retrieval

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
	gonumblas "gonum.org/v1/gonum/blas/gonum"
)

// refBERT is an independent reference for the embedding model: a plain
// float32 forward pass of the sentence-transformers checkpoint (BERT,
// mean pooling, L2 normalization) read straight from model.safetensors,
// with BERT's WordPiece tokenizer from tokenizer.json. It shares no code
// with llama.cpp or the GGUF converter, so agreement checks both.
type refBERT struct {
	vocab   map[string]int
	t       map[string][]float32
	shape   map[string][]int
	dim     int
	heads   int
	layers  int
	eps     float64
	maxToks int
}

func loadRefBERT(dir string) (*refBERT, error) {
	var cfg struct {
		Hidden int     `json:"hidden_size"`
		Heads  int     `json:"num_attention_heads"`
		Layers int     `json:"num_hidden_layers"`
		Eps    float64 `json:"layer_norm_eps"`
	}
	if err := readJSON(filepath.Join(dir, "config.json"), &cfg); err != nil {
		return nil, err
	}
	var tok struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
	}
	if err := readJSON(filepath.Join(dir, "tokenizer.json"), &tok); err != nil {
		return nil, err
	}
	r := &refBERT{vocab: tok.Model.Vocab, dim: cfg.Hidden, heads: cfg.Heads, layers: cfg.Layers, eps: cfg.Eps, maxToks: 256,
		t: map[string][]float32{}, shape: map[string][]int{}}
	raw, err := os.ReadFile(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint64(raw)
	var hdr map[string]json.RawMessage
	if err := json.Unmarshal(raw[8:8+n], &hdr); err != nil {
		return nil, fmt.Errorf("safetensors header: %w", err)
	}
	data := raw[8+n:]
	for name, msg := range hdr {
		if name == "__metadata__" {
			continue
		}
		var ti struct {
			Dtype   string `json:"dtype"`
			Shape   []int  `json:"shape"`
			Offsets [2]int `json:"data_offsets"`
		}
		if err := json.Unmarshal(msg, &ti); err != nil {
			return nil, err
		}
		if ti.Dtype != "F32" {
			continue
		}
		b := data[ti.Offsets[0]:ti.Offsets[1]]
		v := make([]float32, len(b)/4)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		}
		r.t[name], r.shape[name] = v, ti.Shape
	}
	return r, nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// tokenize is BertTokenizer's: clean, lowercase, strip accents, split on
// whitespace and punctuation, then greedy longest-match WordPiece; [CLS]
// and [SEP] around, truncated to maxToks.
func (r *refBERT) tokenize(text string) []int {
	var b strings.Builder
	for _, c := range norm.NFD.String(strings.ToLower(text)) {
		switch {
		case c == 0 || c == 0xfffd || unicode.Is(unicode.Mn, c):
		case unicode.IsSpace(c):
			b.WriteByte(' ')
		case unicode.IsControl(c):
		case isBertPunct(c):
			b.WriteString(" " + string(c) + " ")
		default:
			b.WriteRune(c)
		}
	}
	ids := []int{r.vocab["[CLS]"]}
	for _, w := range strings.Fields(b.String()) {
		ids = append(ids, r.wordpiece(w)...)
	}
	if len(ids) > r.maxToks-1 {
		ids = ids[:r.maxToks-1]
	}
	return append(ids, r.vocab["[SEP]"])
}

func isBertPunct(c rune) bool {
	return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126) || unicode.IsPunct(c)
}

func (r *refBERT) wordpiece(w string) []int {
	rs := []rune(w)
	if len(rs) > 100 {
		return []int{r.vocab["[UNK]"]}
	}
	var out []int
	for start := 0; start < len(rs); {
		end, id := len(rs), -1
		for ; end > start; end-- {
			piece := string(rs[start:end])
			if start > 0 {
				piece = "##" + piece
			}
			if v, ok := r.vocab[piece]; ok {
				id = v
				break
			}
		}
		if id < 0 {
			return []int{r.vocab["[UNK]"]}
		}
		out = append(out, id)
		start = end
	}
	return out
}

// embed runs the encoder on one text and mean-pools every token.
func (r *refBERT) embed(ids []int) []float32 {
	d, n := r.dim, len(ids)
	x := make([][]float64, n)
	we, pe, te := r.t["embeddings.word_embeddings.weight"], r.t["embeddings.position_embeddings.weight"], r.t["embeddings.token_type_embeddings.weight"]
	for i, id := range ids {
		x[i] = make([]float64, d)
		for j := range d {
			x[i][j] = float64(we[id*d+j]) + float64(pe[i*d+j]) + float64(te[j])
		}
		r.layerNorm(x[i], "embeddings.LayerNorm")
	}
	hd := d / r.heads
	for l := range r.layers {
		p := fmt.Sprintf("encoder.layer.%d.", l)
		q, k, v := r.linear(x, p+"attention.self.query"), r.linear(x, p+"attention.self.key"), r.linear(x, p+"attention.self.value")
		ctx := make([][]float64, n)
		for i := range ctx {
			ctx[i] = make([]float64, d)
		}
		for h := range r.heads {
			o := h * hd
			for i := range n {
				scores := make([]float64, n)
				mx := math.Inf(-1)
				for j := range n {
					var s float64
					for c := range hd {
						s += q[i][o+c] * k[j][o+c]
					}
					scores[j] = s / math.Sqrt(float64(hd))
					mx = max(mx, scores[j])
				}
				var z float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					z += scores[j]
				}
				for j := range n {
					for c := range hd {
						ctx[i][o+c] += scores[j] / z * v[j][o+c]
					}
				}
			}
		}
		att := r.linear(ctx, p+"attention.output.dense")
		for i := range n {
			for j := range d {
				x[i][j] += att[i][j]
			}
			r.layerNorm(x[i], p+"attention.output.LayerNorm")
		}
		up := r.linear(x, p+"intermediate.dense")
		for i := range up {
			for j, u := range up[i] {
				up[i][j] = 0.5 * u * (1 + math.Erf(u/math.Sqrt2))
			}
		}
		down := r.linear(up, p+"output.dense")
		for i := range n {
			for j := range d {
				x[i][j] += down[i][j]
			}
			r.layerNorm(x[i], p+"output.LayerNorm")
		}
	}
	mean := make([]float64, d)
	for i := range n {
		for j := range d {
			mean[j] += x[i][j]
		}
	}
	out, err := normalize(mean)
	if err != nil {
		panic(err)
	}
	return out
}

// linear is x·Wᵀ + b with W of shape [out, in], as PyTorch stores it: the
// inputs rounded to float32 as the weights are, each product summed in
// float64 (gonum's Dsdot, whose assembly the race detector does not slow
// down: a Go loop took half a minute under it).
func (r *refBERT) linear(x [][]float64, name string) [][]float64 {
	w, b, sh := r.t[name+".weight"], r.t[name+".bias"], r.shape[name+".weight"]
	impl := gonumblas.Implementation{}
	row32 := make([]float32, sh[1])
	out := make([][]float64, len(x))
	for i, row := range x {
		for c, xv := range row {
			row32[c] = float32(xv)
		}
		out[i] = make([]float64, sh[0])
		for o := range sh[0] {
			out[i][o] = float64(b[o]) + impl.Dsdot(sh[1], row32, 1, w[o*sh[1]:(o+1)*sh[1]], 1)
		}
	}
	return out
}

func (r *refBERT) layerNorm(v []float64, name string) {
	g, b := r.t[name+".weight"], r.t[name+".bias"]
	var mu, va float64
	for _, x := range v {
		mu += x
	}
	mu /= float64(len(v))
	for _, x := range v {
		va += (x - mu) * (x - mu)
	}
	va /= float64(len(v))
	for i, x := range v {
		v[i] = (x-mu)/math.Sqrt(va+r.eps)*float64(g[i]) + float64(b[i])
	}
}
