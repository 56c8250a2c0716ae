package bertonnx

import (
	"fmt"
	"math"
)

// Reference scores one input with a plain float64 forward pass of the
// model as Hugging Face's BertForSequenceClassification computes it: token,
// segment and position embeddings, post-norm encoder layers with exact
// (erf) GELU, the pooler's tanh on [CLS], the classifier. It is slow and
// written for clarity: tests compare llama.cpp's scores of the converted
// file against it.
func (m *Model) Reference(ids, segments []int) (float64, error) {
	n, h := len(ids), m.Hidden
	if n == 0 || n != len(segments) || n > m.MaxPos {
		return 0, fmt.Errorf("bertonnx: %d ids, %d segments (at most %d)", n, len(segments), m.MaxPos)
	}
	word, typ, pos := m.W[WordEmbeddings], m.W[TypeEmbeddings], m.W[PosEmbeddings]
	x := make([][]float64, n)
	for t := range n {
		if ids[t] < 0 || ids[t] >= m.Vocab || segments[t] < 0 || segments[t] >= m.TypeVocab {
			return 0, fmt.Errorf("bertonnx: token %d: id %d, segment %d out of range", t, ids[t], segments[t])
		}
		x[t] = make([]float64, h)
		for d := range h {
			x[t][d] = float64(word[ids[t]*h+d]) + float64(typ[segments[t]*h+d]) + float64(pos[t*h+d])
		}
		m.layerNorm(x[t], EmbeddingsNorm)
	}
	dh := h / m.Heads
	for l := range m.Layers {
		p := Layer(l)
		q, k, v := m.linear(x, p+Query), m.linear(x, p+Key), m.linear(x, p+Value)
		ctx := make([][]float64, n)
		for i := range n {
			ctx[i] = make([]float64, h)
		}
		scores := make([]float64, n)
		for head := range m.Heads {
			off := head * dh
			for i := range n {
				peak := math.Inf(-1)
				for j := range n {
					var s float64
					for d := range dh {
						s += q[i][off+d] * k[j][off+d]
					}
					scores[j] = s / math.Sqrt(float64(dh))
					peak = max(peak, scores[j])
				}
				var sum float64
				for j := range n {
					scores[j] = math.Exp(scores[j] - peak)
					sum += scores[j]
				}
				for j := range n {
					for d := range dh {
						ctx[i][off+d] += scores[j] / sum * v[j][off+d]
					}
				}
			}
		}
		attn := m.linear(ctx, p+AttnOut)
		for t := range n {
			for d := range h {
				x[t][d] += attn[t][d]
			}
			m.layerNorm(x[t], p+AttnOutNorm)
		}
		up := m.linear(x, p+Intermediate)
		for _, row := range up {
			for d, u := range row {
				row[d] = 0.5 * u * (1 + math.Erf(u/math.Sqrt2))
			}
		}
		down := m.linear(up, p+Output)
		for t := range n {
			for d := range h {
				x[t][d] += down[t][d]
			}
			m.layerNorm(x[t], p+OutputNorm)
		}
	}
	pooled := m.linear(x[:1], Pooler)[0]
	for d := range pooled {
		pooled[d] = math.Tanh(pooled[d])
	}
	return m.linear([][]float64{pooled}, Classifier)[0][0], nil
}

// linear is x·W + b for the [in][out] weight of name.
func (m *Model) linear(x [][]float64, name string) [][]float64 {
	w, b := m.W[name+".weight"], m.W[name+".bias"]
	out := len(b)
	in := len(w) / out
	y := make([][]float64, len(x))
	for t, row := range x {
		y[t] = make([]float64, out)
		for o := range out {
			y[t][o] = float64(b[o])
		}
		for i := range in {
			xi := row[i]
			for o, wv := range w[i*out : (i+1)*out] {
				y[t][o] += xi * float64(wv)
			}
		}
	}
	return y
}

func (m *Model) layerNorm(v []float64, name string) {
	g, b := m.W[name+".weight"], m.W[name+".bias"]
	var mean, variance float64
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	for _, x := range v {
		variance += (x - mean) * (x - mean)
	}
	variance /= float64(len(v))
	inv := 1 / math.Sqrt(variance+float64(m.Eps))
	for i, x := range v {
		v[i] = (x-mean)*inv*float64(g[i]) + float64(b[i])
	}
}
