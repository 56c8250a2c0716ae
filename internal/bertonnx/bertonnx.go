// Package bertonnx reads a BERT sequence classifier (a cross-encoder such
// as ms-marco-MiniLM-L-12-v2) from an ONNX file, int8 dynamically quantized
// or not, as float32 weights under Hugging Face's names, and writes it as a
// GGUF file llama.cpp scores with rank pooling.
//
// Two things upstream's converter gets wrong for these models are done
// here: the pooler (dense + tanh on the [CLS] state) is kept, as llama.cpp's
// "cls" tensor with the classifier as "cls.output"; and the passage's
// segment embedding, which llama.cpp's BERT graph never adds (it adds
// segment 0 to every token), is baked into a second copy of the vocabulary:
// id V+i is token i of segment 1 (see SegmentOffset).
package bertonnx

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/dragon-rag/dragon/engine/gguf"
	"github.com/dragon-rag/dragon/internal/onnx"
)

// ErrModel marks an ONNX graph that is not a BERT sequence classifier this
// package understands.
var ErrModel = errors.New("bertonnx: not a supported BERT cross-encoder")

// Model is a BERT cross-encoder's configuration and weights. Linear
// weights are stored as ONNX multiplies them, [in][out] row-major (y = x·W
// + b); embedding tables as [row][Hidden].
type Model struct {
	Vocab, Hidden, Layers, Heads, FF, MaxPos, TypeVocab, Labels int
	Eps                                                         float32
	W                                                           map[string][]float32
}

// Names of the weights.
const (
	WordEmbeddings = "bert.embeddings.word_embeddings.weight"
	TypeEmbeddings = "bert.embeddings.token_type_embeddings.weight"
	PosEmbeddings  = "bert.embeddings.position_embeddings.weight"
	EmbeddingsNorm = "bert.embeddings.LayerNorm"
	Pooler         = "bert.pooler.dense"
	Classifier     = "classifier"
)

// Layer is the name prefix of encoder layer i.
func Layer(i int) string { return fmt.Sprintf("bert.encoder.layer.%d.", i) }

// Linear names of a layer, after Layer(i), each with .weight and .bias.
const (
	Query        = "attention.self.query"
	Key          = "attention.self.key"
	Value        = "attention.self.value"
	AttnOut      = "attention.output.dense"
	AttnOutNorm  = "attention.output.LayerNorm"
	Intermediate = "intermediate.dense"
	Output       = "output.dense"
	OutputNorm   = "output.LayerNorm"
)

// ReadFile reads a model from an ONNX file.
func ReadFile(path string) (*Model, error) {
	g, err := onnx.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := FromGraph(g)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// FromGraph takes a model's weights from an ONNX graph: float initializers
// as they are; an int8/uint8 initializer "X_quantized" with its "X_scale"
// and "X_zero_point" dequantized, (q − zero point) · scale. Weights the
// exporter left unnamed ("onnx::MatMul_1662") are named after the bias the
// graph adds to their product.
func FromGraph(g *onnx.Graph) (*Model, error) {
	consumers := map[string][]*onnx.Node{}
	producer := map[string]*onnx.Node{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			consumers[in] = append(consumers[in], n)
		}
		for _, out := range n.Outputs {
			producer[out] = n
		}
	}
	m := &Model{W: map[string][]float32{}}
	shapes := map[string][]int64{}
	for name, t := range g.Initializers {
		var vals []float32
		var err error
		switch {
		case strings.HasSuffix(name, "_scale") || strings.HasSuffix(name, "_zero_point"):
			continue
		case strings.HasSuffix(name, "_quantized"):
			name = strings.TrimSuffix(name, "_quantized")
			vals, err = dequantize(g, name, t)
		case t.DataType == onnx.Float:
			vals, err = t.Floats()
		default:
			continue
		}
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(name, "onnx::") {
			named, err := nameByBias(g, consumers, t.Name)
			if err != nil {
				return nil, err
			}
			name = named
		}
		if _, dup := m.W[name]; dup {
			return nil, fmt.Errorf("%w: two initializers give %s", ErrModel, name)
		}
		m.W[name] = vals
		shapes[name] = t.Dims
	}
	if err := m.configure(shapes); err != nil {
		return nil, err
	}
	var err error
	if m.Heads, err = heads(g, producer, m.Hidden); err != nil {
		return nil, err
	}
	if m.Eps, err = layerNormEps(g, producer); err != nil {
		return nil, err
	}
	return m, nil
}

func dequantize(g *onnx.Graph, base string, q *onnx.Tensor) ([]float32, error) {
	st, zt := g.Initializers[base+"_scale"], g.Initializers[base+"_zero_point"]
	if st == nil || zt == nil {
		return nil, fmt.Errorf("%w: %s has no scale or zero point", ErrModel, q.Name)
	}
	scale, err := st.Floats()
	if err != nil {
		return nil, err
	}
	zero, err := zt.Ints()
	if err != nil {
		return nil, err
	}
	if len(scale) != 1 || len(zero) != 1 {
		return nil, fmt.Errorf("%w: %s is quantized per channel (%d scales); only per-tensor is supported", ErrModel, q.Name, len(scale))
	}
	if q.DataType != onnx.Int8 && q.DataType != onnx.Uint8 {
		return nil, fmt.Errorf("%w: %s has element type %d", ErrModel, q.Name, q.DataType)
	}
	ints, err := q.Ints()
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(ints))
	for i, v := range ints {
		out[i] = float32(v-zero[0]) * scale[0]
	}
	return out, nil
}

// nameByBias follows the product of weight w (through Cast and Mul, which
// rescale a quantized product) to the Add of a named bias "P.bias", and
// names w "P.weight".
func nameByBias(g *onnx.Graph, consumers map[string][]*onnx.Node, w string) (string, error) {
	var start *onnx.Node
	for _, n := range consumers[w] {
		if (n.OpType == "MatMulInteger" || n.OpType == "MatMul") && len(n.Inputs) > 1 && n.Inputs[1] == w {
			start = n
		}
	}
	if start == nil {
		return "", fmt.Errorf("%w: no MatMul multiplies by %s", ErrModel, w)
	}
	n := start
	for range 4 {
		next := consumers[n.Outputs[0]]
		if len(next) != 1 {
			break
		}
		n = next[0]
		switch n.OpType {
		case "Cast", "Mul":
			continue
		case "Add":
			for _, in := range n.Inputs {
				if strings.HasSuffix(in, ".bias") && g.Initializers[in] != nil {
					return strings.TrimSuffix(in, ".bias") + ".weight", nil
				}
			}
		}
		break
	}
	return "", fmt.Errorf("%w: the product of %s reaches no named bias", ErrModel, w)
}

// configure reads the dimensions off the weights' shapes and checks that
// every weight the encoder needs is there with the shape it needs.
func (m *Model) configure(shapes map[string][]int64) error {
	dims := func(name string) []int64 { return shapes[name] }
	word, typ, pos := dims(WordEmbeddings), dims(TypeEmbeddings), dims(PosEmbeddings)
	if len(word) != 2 || len(typ) != 2 || len(pos) != 2 {
		return fmt.Errorf("%w: word, segment and position embeddings are needed", ErrModel)
	}
	m.Vocab, m.Hidden, m.TypeVocab, m.MaxPos = int(word[0]), int(word[1]), int(typ[0]), int(pos[0])
	for m.W[Layer(m.Layers)+Query+".weight"] != nil {
		m.Layers++
	}
	if up := dims(Layer(0) + Intermediate + ".weight"); len(up) == 2 {
		m.FF = int(up[1])
	}
	if cls := dims(Classifier + ".weight"); len(cls) == 2 {
		m.Labels = int(cls[1])
	}
	if m.Layers == 0 || m.FF == 0 || m.Labels == 0 || m.TypeVocab < 2 {
		return fmt.Errorf("%w: %d layers, feed-forward %d, %d labels, %d segments", ErrModel, m.Layers, m.FF, m.Labels, m.TypeVocab)
	}
	h, ff := int64(m.Hidden), int64(m.FF)
	want := map[string][]int64{
		TypeEmbeddings:             {int64(m.TypeVocab), h},
		PosEmbeddings:              {int64(m.MaxPos), h},
		EmbeddingsNorm + ".weight": {h}, EmbeddingsNorm + ".bias": {h},
		Pooler + ".weight": {h, h}, Pooler + ".bias": {h},
		Classifier + ".weight": {h, int64(m.Labels)}, Classifier + ".bias": {int64(m.Labels)},
	}
	for i := range m.Layers {
		p := Layer(i)
		for _, lin := range []struct {
			name    string
			in, out int64
		}{{Query, h, h}, {Key, h, h}, {Value, h, h}, {AttnOut, h, h}, {Intermediate, h, ff}, {Output, ff, h}} {
			want[p+lin.name+".weight"] = []int64{lin.in, lin.out}
			want[p+lin.name+".bias"] = []int64{lin.out}
		}
		for _, norm := range []string{AttnOutNorm, OutputNorm} {
			want[p+norm+".weight"] = []int64{h}
			want[p+norm+".bias"] = []int64{h}
		}
	}
	for name, shape := range want {
		got, ok := shapes[name]
		if !ok {
			return fmt.Errorf("%w: no weight %s", ErrModel, name)
		}
		// ONNX stores 1-element biases and scalars with any rank.
		if fmt.Sprint(got) != fmt.Sprint(shape) && !(len(shape) == 1 && len(m.W[name]) == int(shape[0])) {
			return fmt.Errorf("%w: %s has shape %v, want %v", ErrModel, name, got, shape)
		}
	}
	return nil
}

// heads finds the attention's head count in the graph: the constant
// (heads, head size) its Reshapes split the hidden state into.
func heads(g *onnx.Graph, producer map[string]*onnx.Node, hidden int) (int, error) {
	constant := func(name string) (int64, bool) {
		t := constantOf(producer, name)
		if t == nil {
			return 0, false
		}
		v, err := t.Ints()
		if err != nil || len(v) != 1 {
			return 0, false
		}
		return v[0], true
	}
	for _, n := range g.Nodes {
		if n.OpType != "Reshape" || len(n.Inputs) < 2 {
			continue
		}
		c := producer[n.Inputs[1]]
		if c == nil || c.OpType != "Concat" || len(c.Inputs) < 2 {
			continue
		}
		h, ok1 := constant(c.Inputs[len(c.Inputs)-2])
		d, ok2 := constant(c.Inputs[len(c.Inputs)-1])
		if ok1 && ok2 && h > 0 && d > 0 && int(h*d) == hidden {
			return int(h), nil
		}
	}
	return 0, fmt.Errorf("%w: no reshape into attention heads found", ErrModel)
}

// constantOf is the value of the Constant node that produces name (nil:
// another kind of node, or none).
func constantOf(producer map[string]*onnx.Node, name string) *onnx.Tensor {
	if p := producer[name]; p != nil && p.OpType == "Constant" {
		return p.Value
	}
	return nil
}

// layerNormEps is the constant the decomposed LayerNorms add to the
// variance before its square root.
func layerNormEps(g *onnx.Graph, producer map[string]*onnx.Node) (float32, error) {
	eps := float32(-1)
	for _, n := range g.Nodes {
		if n.OpType != "Sqrt" {
			continue
		}
		add := producer[n.Inputs[0]]
		if add == nil || add.OpType != "Add" {
			continue
		}
		for _, in := range add.Inputs {
			t := constantOf(producer, in)
			if t == nil {
				continue
			}
			v, err := t.Floats()
			if err != nil || len(v) != 1 {
				continue
			}
			if eps >= 0 && v[0] != eps {
				return 0, fmt.Errorf("%w: layer norms with epsilons %g and %g", ErrModel, eps, v[0])
			}
			eps = v[0]
		}
	}
	if eps < 0 {
		return 0, fmt.Errorf("%w: no layer norm epsilon found", ErrModel)
	}
	return eps, nil
}

// SegmentOffset is what a token of the second segment (the passage) adds to
// its id in the GGUF file: the file's vocabulary is the model's twice over.
func (m *Model) SegmentOffset() int { return m.Vocab }

// Vocabulary is a BERT WordPiece vocabulary (vocab.txt's lines) and which
// of its entries are special tokens.
type Vocabulary struct {
	Tokens                       []string
	Special                      map[string]bool
	CLS, SEP, Pad, Unknown, Mask int
}

// WriteGGUF writes the model for llama.cpp: architecture bert, rank
// pooling, float32 weights, and the vocabulary twice (segment 0, then
// segment 1).
func (m *Model) WriteGGUF(dst io.Writer, name string, v Vocabulary) error {
	if len(v.Tokens) != m.Vocab {
		return fmt.Errorf("%w: vocabulary of %d tokens for embeddings of %d", ErrModel, len(v.Tokens), m.Vocab)
	}
	if m.Labels != 1 {
		return fmt.Errorf("%w: %d labels; a ranker has one", ErrModel, m.Labels)
	}
	var w gguf.Writer
	w.String("general.architecture", "bert")
	w.String("general.name", name)
	w.Uint32("bert.context_length", uint32(m.MaxPos))
	w.Uint32("bert.embedding_length", uint32(m.Hidden))
	w.Uint32("bert.feed_forward_length", uint32(m.FF))
	w.Uint32("bert.block_count", uint32(m.Layers))
	w.Uint32("bert.attention.head_count", uint32(m.Heads))
	w.Float32("bert.attention.layer_norm_epsilon", m.Eps)
	w.Bool("bert.attention.causal", false)
	w.Uint32("bert.pooling_type", 4) // LLAMA_POOLING_TYPE_RANK
	w.String("tokenizer.ggml.model", "bert")
	w.Uint32("tokenizer.ggml.token_type_count", uint32(m.TypeVocab))

	tokens := make([]string, 0, 2*m.Vocab)
	types := make([]int32, 0, 2*m.Vocab)
	for _, t := range v.Tokens {
		// llama.cpp's WordPiece marks a word's start with "▁" where
		// vocab.txt marks its continuations with "##".
		switch {
		case v.Special[t] || strings.HasPrefix(t, "[") && strings.HasSuffix(t, "]"):
		case strings.HasPrefix(t, "##"):
			t = t[2:]
		default:
			t = "\u2581" + t
		}
		tokens = append(tokens, t)
	}
	for _, t := range v.Tokens {
		typ := int32(1) // normal
		if v.Special[t] {
			typ = 3 // control
		}
		types = append(types, typ)
	}
	for i := range m.Vocab {
		// Texts the tokenizer can never produce (it splits at spaces and
		// brackets), so the copies are reached only by id. Normal tokens:
		// llama.cpp gives unused ones no text, and the re-ranker checks the
		// first copy's to know the file.
		tokens = append(tokens, fmt.Sprintf("[segment 1 #%d]", i))
		types = append(types, 1)
	}
	w.Strings("tokenizer.ggml.tokens", tokens)
	w.Int32s("tokenizer.ggml.token_type", types)
	w.Uint32("tokenizer.ggml.cls_token_id", uint32(v.CLS))
	w.Uint32("tokenizer.ggml.seperator_token_id", uint32(v.SEP))
	w.Uint32("tokenizer.ggml.padding_token_id", uint32(v.Pad))
	w.Uint32("tokenizer.ggml.unknown_token_id", uint32(v.Unknown))
	w.Uint32("tokenizer.ggml.mask_token_id", uint32(v.Mask))

	h := m.Hidden
	word, typ := m.W[WordEmbeddings], m.W[TypeEmbeddings]
	embd := make([]float32, 2*m.Vocab*h)
	copy(embd, word)
	for i := range m.Vocab {
		for d := range h {
			// llama.cpp adds segment 0's row to every token.
			embd[(m.Vocab+i)*h+d] = word[i*h+d] + typ[h+d] - typ[d]
		}
	}
	uh, uff := uint64(h), uint64(m.FF)
	w.Tensor("token_embd.weight", embd, uh, uint64(2*m.Vocab))
	w.Tensor("token_types.weight", typ, uh, uint64(m.TypeVocab))
	w.Tensor("position_embd.weight", m.W[PosEmbeddings], uh, uint64(m.MaxPos))
	w.Tensor("token_embd_norm.weight", m.W[EmbeddingsNorm+".weight"], uh)
	w.Tensor("token_embd_norm.bias", m.W[EmbeddingsNorm+".bias"], uh)
	for i := range m.Layers {
		p, blk := Layer(i), fmt.Sprintf("blk.%d.", i)
		linear := func(to, from string, in, out uint64) {
			w.Tensor(blk+to+".weight", transpose(m.W[p+from+".weight"], int(in), int(out)), in, out)
			w.Tensor(blk+to+".bias", m.W[p+from+".bias"], out)
		}
		norm := func(to, from string) {
			w.Tensor(blk+to+".weight", m.W[p+from+".weight"], uh)
			w.Tensor(blk+to+".bias", m.W[p+from+".bias"], uh)
		}
		linear("attn_q", Query, uh, uh)
		linear("attn_k", Key, uh, uh)
		linear("attn_v", Value, uh, uh)
		linear("attn_output", AttnOut, uh, uh)
		norm("attn_output_norm", AttnOutNorm)
		linear("ffn_up", Intermediate, uh, uff)
		linear("ffn_down", Output, uff, uh)
		norm("layer_output_norm", OutputNorm)
	}
	w.Tensor("cls.weight", transpose(m.W[Pooler+".weight"], h, h), uh, uh)
	w.Tensor("cls.bias", m.W[Pooler+".bias"], uh)
	w.Tensor("cls.output.weight", transpose(m.W[Classifier+".weight"], h, 1), uh, 1)
	w.Tensor("cls.output.bias", m.W[Classifier+".bias"], 1)
	_, err := w.WriteTo(dst)
	return err
}

// transpose turns an [in][out] matrix into ggml's [out][in] (ne0 = in).
func transpose(x []float32, in, out int) []float32 {
	t := make([]float32, len(x))
	for i := range in {
		for o := range out {
			t[o*in+i] = x[i*out+o]
		}
	}
	return t
}
