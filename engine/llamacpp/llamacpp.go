// Package llamacpp is the llama.cpp backend of engine, on upstream
// llama.cpp 0c1e57098 (ggml 0.25.3) as PyPI's llama-cpp-python 0.3.36
// vendors it, linked statically.
//
// A small C layer (shim.c) talks to llama.h for everything on the hot path,
// so that one decode is one short cgo call and an abort is told apart from
// a full KV cache; llama.cpp's log goes to slog. Passes run on a worker
// thread per context, and Decode waits for their end in the netpoller
// (docs/DESIGN-NOTES.md, "A pass runs off Go's threads").
//
// Build: `make deps` builds the libraries and headers into build/llama
// (scripts/build-llama.sh); the Makefile sets the -march flags. For
// linux/arm64, `make device-arm64` cross-builds them into
// build/llama-arm64, which the arm64 cgo lines name instead.
package llamacpp

/*
#cgo CFLAGS: -std=c11
#cgo amd64 CFLAGS: -I${SRCDIR}/../../build/llama/include
#cgo amd64 LDFLAGS: -L${SRCDIR}/../../build/llama/lib
#cgo arm64 CFLAGS: -I${SRCDIR}/../../build/llama-arm64/include
#cgo arm64 LDFLAGS: -L${SRCDIR}/../../build/llama-arm64/lib
#cgo LDFLAGS: -lllama -lggml -lggml-cpu -lggml-base -lstdc++ -lm -ldl -lpthread
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/dragon-rag/dragon/engine"
	"github.com/dragon-rag/dragon/engine/gguf"
)

var backendOnce sync.Once

// Build names the llama.cpp this package runs, down to the flags it was
// built with (a native build's kernels round differently from a portable
// one's). A sequence state it saves loads only into contexts of the same
// build and KV settings, so caches of states key on both (KVSettings).
var Build = "llama.cpp 0c1e57098 (ggml " + ggmlVersion + ", llamafile off, build " + C.GoString(C.dragon_llama_build()) + ")"

// ggmlVersion is the ggml the pinned llama.cpp carries; a library that
// reports another is refused at start-up.
const ggmlVersion = "0.25.3"

// KVSettings are the context settings that change the bytes of a saved
// sequence state: f16 K and V always (with flash attention off, V is
// stored transposed), and whether the buffer is unified.
func KVSettings(unified bool) []string {
	return []string{"kv=f16", fmt.Sprintf("unified=%t", unified)}
}

// Options configure model loading.
type Options struct {
	// Threads is the default compute thread count of contexts that don't
	// set their own (0: runtime.NumCPU()).
	Threads int
	// InPlace keeps every weight in the file's mapping: no repacking into
	// anonymous memory for faster kernels (which copies Q4_K and the like:
	// 699 MiB of Qwen2.5-1.5B's 1,066), so that the kernel may drop and
	// read back any of it, as a model larger than its memory budget needs.
	InPlace bool
}

// Model is a llama.cpp model, memory-mapped. Unload frees it while it is
// idle, keeping what Go holds (Info, pieces, the template), and the next
// call that needs llama.cpp loads it back.
type Model struct {
	info      engine.ModelInfo
	threads   int
	inPlace   bool // Options.InPlace, kept for a load after an unload
	pieces    [][]byte
	eog       []bool
	tmpl      string
	footprint Footprint
	// oneCache: the model's memory is one plain KV cache (no sliding
	// window, no recurrent state), whose sequence states SeqState can
	// make independent of the context's stream count.
	oneCache bool

	// mu guards c and vocab: calls into them hold it for reading, so that
	// Unload (which holds it for writing) never frees a model in use.
	mu       sync.RWMutex
	c        *C.struct_llama_model // nil while unloaded
	vocab    *C.struct_llama_vocab
	closed   bool
	contexts atomic.Int32 // open contexts, which Unload waits out
	prefetch atomic.Pointer[Prefetch]
}

// Footprint is what a model costs in memory, for sizing contexts to a
// budget.
type Footprint struct {
	// Weights are the tensors' bytes, mapped from the file: resident as
	// they are read, and dropped by the kernel under pressure.
	Weights int64
	// KVPerToken is the bytes of one position of one sequence in the KV
	// cache: layers × KV heads × (K head dim + V head dim) × 2 (f16).
	KVPerToken int64
	Vocab      int
	Heads      int
}

var _ engine.Model = (*Model)(nil)

// Load memory-maps a GGUF model.
func Load(path string, opts Options) (*Model, error) {
	if err := checkGGUF(path); err != nil {
		return nil, err
	}
	backendOnce.Do(initBackend)
	if errBackend != nil {
		return nil, errBackend
	}

	cm, err := loadModel(path, opts.InPlace)
	if err != nil {
		return nil, err
	}
	m := &Model{c: cm, vocab: C.llama_model_get_vocab(cm), threads: opts.Threads, inPlace: opts.InPlace}
	m.oneCache = C.llama_model_n_swa(cm) == 0 && !bool(C.llama_model_is_recurrent(cm)) && !bool(C.llama_model_is_hybrid(cm))
	if m.threads <= 0 {
		m.threads = runtime.NumCPU()
	}
	n := int(C.llama_vocab_n_tokens(m.vocab))
	m.pieces = make([][]byte, n)
	m.eog = make([]bool, n)
	fp := sha256.New()
	var unused []engine.Token
	for i := range n {
		m.pieces[i] = m.tokenPiece(C.llama_token(i))
		m.eog[i] = bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(i)))
		text := C.GoString(C.llama_vocab_get_text(m.vocab, C.llama_token(i)))
		attr := C.llama_vocab_get_attr(m.vocab, C.llama_token(i))
		if attr&C.LLAMA_TOKEN_ATTR_UNUSED != 0 {
			unused = append(unused, engine.Token(i))
		}
		var hdr [8]byte
		binary.LittleEndian.PutUint32(hdr[:4], uint32(len(text)))
		binary.LittleEndian.PutUint32(hdr[4:], uint32(attr))
		fp.Write(hdr[:])
		fp.Write([]byte(text))
	}
	if t := C.llama_model_chat_template(cm, nil); t != nil {
		m.tmpl = C.GoString(t)
	}
	arch := m.meta("general.architecture")
	// The GGUF's tokenizer keys (merges, special ids) beside what llama.cpp
	// made of them: models of one family with different weights, shapes or
	// architectures mix, any difference in tokenization refuses.
	tokHash, err := gguf.TokenizerHash(path)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%w: %w", engine.ErrBadModel, err)
	}
	fmt.Fprintf(fp, "tokenizer=%s type=%d bos=%d eos=%d eot=%d", tokHash, C.llama_vocab_type(m.vocab),
		C.llama_vocab_bos(m.vocab), C.llama_vocab_eos(m.vocab), C.llama_vocab_eot(m.vocab))
	m.info = engine.ModelInfo{
		Path:        path,
		Arch:        arch,
		Name:        m.meta("general.name"),
		VocabSize:   n,
		EmbedDim:    int(C.llama_model_n_embd(cm)),
		TrainCtx:    int(C.llama_model_n_ctx_train(cm)),
		Fingerprint: "vocab/" + hex.EncodeToString(fp.Sum(nil))[:32],
		Unused:      unused,
		Pooling:     poolingName(m.meta(arch + ".pooling_type")),
		// llama.cpp's key; causal unless the model says otherwise.
		Bidirectional: m.meta(arch+".attention.causal") == "false",
	}
	m.footprint = m.readFootprint(arch)
	if m.info.Name == "" {
		// Converted checkpoints may carry no name; fine-tuned variants of
		// one base share every shape, so the name comes from the bytes.
		name, err := contentName(path)
		if err != nil {
			m.Close()
			return nil, err
		}
		m.info.Name = name
	}
	return m, nil
}

func loadModel(path string, inPlace bool) (*C.struct_llama_model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	cm := C.dragon_model_load(cpath, cbool(!inPlace))
	if cm == nil {
		return nil, fmt.Errorf("%w: llama.cpp could not load %s (unsupported architecture or corrupt tensors; run with -v for llama.cpp's log)", engine.ErrBadModel, path)
	}
	return cm, nil
}

// readFootprint reads the KV shape from the model: the head dims from
// the GGUF keys when present (they may differ from n_embd/n_head), else
// n_embd/n_head as llama.cpp assumes.
func (m *Model) readFootprint(arch string) Footprint {
	heads := int64(C.llama_model_n_head(m.c))
	headDim := int64(C.llama_model_n_embd(m.c)) / max(heads, 1)
	dimK, dimV := headDim, headDim
	if v, err := strconv.ParseInt(m.meta(arch+".attention.key_length"), 10, 64); err == nil {
		dimK = v
	}
	if v, err := strconv.ParseInt(m.meta(arch+".attention.value_length"), 10, 64); err == nil {
		dimV = v
	}
	layers, kvHeads := int64(C.llama_model_n_layer(m.c)), int64(C.llama_model_n_head_kv(m.c))
	return Footprint{
		Weights:    int64(C.llama_model_size(m.c)),
		KVPerToken: layers * kvHeads * (dimK + dimV) * 2,
		Vocab:      len(m.pieces),
		Heads:      int(heads),
	}
}

// Footprint is what the model costs in memory.
func (m *Model) Footprint() Footprint { return m.footprint }

// contentName names a nameless model by a hash of its first 4 MiB: the
// metadata and the start of the first tensor (the token embeddings).
func contentName(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", engine.ErrBadModel, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, 4<<20); err != nil && err != io.EOF {
		return "", fmt.Errorf("%w: read %s: %w", engine.ErrBadModel, path, err)
	}
	return "unnamed-" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// checkGGUF turns the common ways a path can be wrong into clear errors
// before llama.cpp sees it.
func checkGGUF(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %w (fetch the default model with `make model`, or pass --model)", engine.ErrBadModel, err)
	}
	defer f.Close()
	var magic [4]byte
	if _, err := io.ReadFull(f, magic[:]); err != nil || !bytes.Equal(magic[:], []byte("GGUF")) {
		return fmt.Errorf("%w: %s is not a GGUF file", engine.ErrBadModel, path)
	}
	return nil
}

// poolingName reads llama.cpp's pooling_type metadata (enum
// llama_pooling_type).
func poolingName(v string) string {
	switch v {
	case "1":
		return "mean"
	case "2":
		return "cls"
	case "3":
		return "last"
	case "4":
		return "rank"
	default:
		return ""
	}
}

func (m *Model) meta(key string) string {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	buf := make([]byte, 256)
	n := C.llama_model_meta_val_str(m.c, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	return string(buf[:min(int(n), len(buf)-1)])
}

func (m *Model) tokenPiece(t C.llama_token) []byte {
	buf := make([]byte, 32)
	for {
		n := int(C.llama_token_to_piece(m.vocab, t, (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, true))
		if n >= 0 {
			return buf[:n:n]
		}
		buf = make([]byte, -n)
	}
}

// Info implements engine.Model.
func (m *Model) Info() engine.ModelInfo { return m.info }

// Tokenize implements engine.Model.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]engine.Token, error) {
	if err := m.hold(); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	if text == "" && !addSpecial {
		return nil, nil
	}
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	out := make([]engine.Token, len(text)+2)
	for {
		n := int(C.llama_tokenize(m.vocab, ctext, C.int32_t(len(text)),
			(*C.llama_token)(unsafe.Pointer(&out[0])), C.int32_t(len(out)), C.bool(addSpecial), C.bool(parseSpecial)))
		if n >= 0 {
			return out[:n], nil
		}
		if -n <= len(out) {
			return nil, fmt.Errorf("llamacpp: tokenize failed (%d)", n)
		}
		out = make([]engine.Token, -n)
	}
}

// Piece implements engine.Model.
func (m *Model) Piece(t engine.Token) []byte {
	if t < 0 || int(t) >= len(m.pieces) {
		return nil
	}
	return m.pieces[t]
}

// IsEOG implements engine.Model.
func (m *Model) IsEOG(t engine.Token) bool {
	return t >= 0 && int(t) < len(m.eog) && m.eog[t]
}

// ChatPrompt implements engine.Model with the model's own template, which
// llama.cpp recognises (ChatML for SmolLM2).
func (m *Model) ChatPrompt(msgs []engine.Message, addAssistant bool) (string, error) {
	if len(msgs) == 0 {
		return "", fmt.Errorf("%w: no messages", engine.ErrInvalidInput)
	}
	if m.tmpl == "" {
		return "", fmt.Errorf("%w: model %s has no chat template", engine.ErrInvalidInput, m.info.Name)
	}
	ctmpl := C.CString(m.tmpl)
	defer C.free(unsafe.Pointer(ctmpl))
	cmsgs := (*[1 << 20]C.struct_llama_chat_message)(C.malloc(C.size_t(len(msgs)) * C.size_t(unsafe.Sizeof(C.struct_llama_chat_message{}))))[:len(msgs):len(msgs)]
	defer C.free(unsafe.Pointer(&cmsgs[0]))
	total := 0
	for i, msg := range msgs {
		cmsgs[i].role = C.CString(string(msg.Role))
		cmsgs[i].content = C.CString(msg.Content)
		total += len(msg.Role) + len(msg.Content)
	}
	defer func() {
		for _, cm := range cmsgs {
			C.free(unsafe.Pointer(cm.role))
			C.free(unsafe.Pointer(cm.content))
		}
	}()
	buf := make([]byte, 2*total+256)
	for {
		n := int(C.llama_chat_apply_template(ctmpl, &cmsgs[0], C.size_t(len(msgs)), C.bool(addAssistant),
			(*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf))))
		if n < 0 {
			return "", fmt.Errorf("%w: llama.cpp does not support the chat template of %s", engine.ErrInvalidInput, m.info.Name)
		}
		if n <= len(buf) {
			return string(buf[:n]), nil
		}
		buf = make([]byte, n)
	}
}

// hold read-locks the model loaded, loading it back after Unload; the
// caller calls m.mu.RUnlock when done with m.c and m.vocab.
func (m *Model) hold() error {
	for {
		m.mu.RLock()
		switch {
		case m.closed:
			m.mu.RUnlock()
			return engine.ErrClosed
		case m.c != nil:
			return nil
		}
		m.mu.RUnlock()
		// An Unload may slip in between the reload and the read lock:
		// then load again.
		if err := m.reload(); err != nil {
			return err
		}
	}
}

// reload loads the model back after Unload.
func (m *Model) reload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.c != nil {
		return nil
	}
	cm, err := loadModel(m.info.Path, m.inPlace)
	if err != nil {
		return err
	}
	// The Go side (pieces, fingerprint) was read from the first load: a
	// file replaced since would not match it.
	vocab := C.llama_model_get_vocab(cm)
	if int(C.llama_vocab_n_tokens(vocab)) != m.footprint.Vocab || int64(C.llama_model_size(cm)) != m.footprint.Weights {
		C.llama_model_free(cm)
		return fmt.Errorf("%w: %s changed on disk since it was first loaded", engine.ErrBadModel, m.info.Path)
	}
	m.c, m.vocab = cm, vocab
	return nil
}

// Unload frees the model's weights (their mapping goes back to the OS)
// until a call needs them again. It fails while contexts are open: they
// use the weights.
func (m *Model) Unload() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.c == nil {
		return nil
	}
	if n := m.contexts.Load(); n > 0 {
		return fmt.Errorf("llamacpp: %d contexts of %s still open", n, m.info.Name)
	}
	C.llama_model_free(m.c)
	m.c, m.vocab = nil, nil
	return nil
}

// Loaded reports whether the weights are loaded (not closed, not
// unloaded).
func (m *Model) Loaded() bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.c != nil && !m.closed
}

// Close frees the model. Contexts must be closed first.
func (m *Model) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		if m.c != nil {
			C.llama_model_free(m.c)
			m.c, m.vocab = nil, nil
		}
	}
	return nil
}

// NewContext implements engine.Model.
func (m *Model) NewContext(opts engine.ContextOptions) (engine.Context, error) {
	return m.NewLlamaContext(opts)
}

// NewLlamaContext is NewContext returning the concrete type. With
// opts.Unified attention spans every sequence's cells (masked); otherwise
// each sequence has its own stream.
func (m *Model) NewLlamaContext(opts engine.ContextOptions) (*Context, error) {
	unified := opts.Unified
	if opts.MaxSeqs <= 0 || opts.CtxPerSeq <= 0 {
		return nil, fmt.Errorf("%w: context needs MaxSeqs and CtxPerSeq > 0 (got %d, %d)", engine.ErrInvalidInput, opts.MaxSeqs, opts.CtxPerSeq)
	}
	if opts.MaxSeqs > 256 {
		return nil, fmt.Errorf("%w: at most 256 sequences (got %d)", engine.ErrInvalidInput, opts.MaxSeqs)
	}
	if opts.BatchSize <= 0 {
		opts.BatchSize = opts.CtxPerSeq
	}
	if opts.Threads <= 0 {
		opts.Threads = m.threads
	}
	cells := opts.CtxPerSeq * opts.MaxSeqs
	if unified && opts.Cells > 0 {
		cells = opts.Cells
	}
	// One verification pass is one graph; long prefills are cut into graphs
	// of 512 tokens so an abort never waits for more than one of them. An
	// encoder needs a whole batch in one graph (llama.cpp asserts it).
	ubatch := min(opts.BatchSize, 512)
	if m.info.Bidirectional {
		ubatch = opts.BatchSize
	}
	if err := m.hold(); err != nil {
		return nil, err
	}
	defer m.mu.RUnlock()
	embeddings := C.int(0)
	switch {
	case opts.Embeddings && m.info.Pooling == "rank":
		// A ranking model's per-token states mean nothing; its score per
		// sequence does (SeqScore).
		embeddings = 2
	case opts.Embeddings:
		embeddings = 1
	}
	var stream *C.dragon_stream
	if embeddings == 0 {
		var err error
		if stream, err = m.newStream(); err != nil {
			return nil, err
		}
	}
	// An embedding context of a streamed model reads the weights from the
	// mapping, so its passes wait while a streamed one points them into
	// its buffers.
	turns := m.prefetch.Load() != nil
	cc := C.dragon_ctx_new(m.c, C.uint32_t(cells), C.uint32_t(opts.BatchSize), C.uint32_t(ubatch),
		C.uint32_t(opts.MaxSeqs), C.int32_t(opts.Threads), embeddings, cbool(unified), stream, cbool(turns))
	if cc == nil {
		C.dragon_stream_free(stream)
		return nil, fmt.Errorf("llamacpp: could not create a context of %d cells for %d sequences", cells, opts.MaxSeqs)
	}
	c := &Context{
		model:   m,
		c:       cc,
		stream:  stream,
		lc:      C.dragon_ctx_llama(cc),
		opts:    opts,
		unified: unified,
		lens:    engine.NewSeqLens(opts.MaxSeqs, opts.CtxPerSeq),
		vocab:   len(m.pieces),
	}
	c.mem = C.llama_get_memory(c.lc)
	c.done = os.NewFile(uintptr(C.dragon_decode_done_fd(cc)), "llamacpp-pass-done")
	m.contexts.Add(1)
	return c, nil
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// Context is a llama.cpp decoding context.
type Context struct {
	stream  *C.dragon_stream // owned by c; nil without a Prefetch
	model   *Model
	c       *C.dragon_ctx
	done    *os.File // the end of each pass (an eventfd the worker writes)
	lc      *C.struct_llama_context
	mem     C.llama_memory_t
	opts    engine.ContextOptions
	unified bool
	lens    *engine.SeqLens
	vocab   int

	// Batch arrays handed to C, reused across calls.
	tok, pos, nseq, seqs []int32
	logit                []int8
	rows                 []bool // rows of the last decode that have logits
	// scratch holds llama.cpp's form of a sequence state on its way in or
	// out, reused: a warm restore of a few MB then costs one copy, not an
	// allocation.
	scratch []byte

	abortMu        sync.Mutex
	inFlight       bool
	abortRequested bool
	gen            uint64 // bumped on arm and disarm: late AfterFuncs miss
	closed         bool
}

var _ engine.Context = (*Context)(nil)

// Decode implements engine.Context.
func (c *Context) Decode(ctx context.Context, b *engine.Batch) error {
	if c.closed {
		return engine.ErrClosed
	}
	if err := c.lens.Check(b, c.vocab, c.opts.BatchSize); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %w", engine.ErrAborted, err)
	}
	n := len(b.Entries)
	c.tok, c.pos, c.nseq = c.tok[:0], c.pos[:0], c.nseq[:0]
	c.seqs, c.logit = c.seqs[:0], c.logit[:0]
	for _, e := range b.Entries {
		c.tok = append(c.tok, e.Token)
		c.pos = append(c.pos, int32(e.Pos))
		c.nseq = append(c.nseq, int32(len(e.Seqs)))
		for _, s := range e.Seqs {
			c.seqs = append(c.seqs, int32(s))
		}
		var l int8
		if e.Logits {
			l = 1
		}
		c.logit = append(c.logit, l)
	}
	c.rows = c.rows[:0]

	gen := c.arm()
	stop := context.AfterFunc(ctx, func() { c.abortGen(gen) })
	code := C.dragon_decode_start(c.c, C.int32_t(n), (*C.int32_t)(&c.tok[0]), (*C.int32_t)(&c.pos[0]),
		(*C.int32_t)(&c.nseq[0]), (*C.int32_t)(&c.seqs[0]), (*C.int8_t)(&c.logit[0]))
	if code == 0 {
		// The pass runs on the context's worker thread; this goroutine
		// parks in the netpoller until it ends (an abort ends it early).
		var end [8]byte
		if _, err := io.ReadFull(c.done, end[:]); err != nil {
			panic(fmt.Sprintf("llamacpp: reading the end of a pass: %v", err)) // the context's own eventfd: cannot fail
		}
		code = C.dragon_decode_result(c.c)
	}
	stop()
	aborted := c.disarm()

	if code == 0 {
		c.lens.Apply(b)
		for _, e := range b.Entries {
			c.rows = append(c.rows, e.Logits)
		}
		return nil
	}
	// llama.cpp keeps the ubatches it finished: drop them so that no
	// position of a failed batch stays in any sequence.
	for seq, l := range c.lens.Touched(b) {
		C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(l), -1)
	}
	switch {
	case code == 2 || aborted:
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", engine.ErrAborted, ctx.Err())
		}
		return engine.ErrAborted
	case code == 1:
		return fmt.Errorf("%w: no KV slot for a batch of %d tokens", engine.ErrContextFull, n)
	default:
		return fmt.Errorf("llamacpp: llama_decode failed with code %d", code)
	}
}

// arm marks a decode in flight and clears any stale abort request.
func (c *Context) arm() uint64 {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	c.gen++
	c.inFlight = true
	C.dragon_abort(c.c, 0)
	return c.gen
}

// disarm ends the decode and reports whether an abort was requested.
func (c *Context) disarm() bool {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	c.inFlight = false
	c.gen++
	return c.clearAbortLocked()
}

func (c *Context) clearAbortLocked() bool {
	was := c.abortRequested
	c.abortRequested = false
	C.dragon_abort(c.c, 0)
	return was
}

func (c *Context) abortGen(gen uint64) {
	c.abortMu.Lock()
	defer c.abortMu.Unlock()
	if c.inFlight && c.gen == gen {
		c.abortRequested = true
		C.dragon_abort(c.c, 1)
	}
}

// Abort implements engine.Context: the decode in flight, if any, returns
// ErrAborted as soon as ggml finishes the graph node it is computing.
func (c *Context) Abort() {
	c.abortMu.Lock()
	gen := c.gen
	c.abortMu.Unlock()
	c.abortGen(gen)
}

func (c *Context) row(i int) error {
	if i < 0 || i >= len(c.rows) || !c.rows[i] {
		return fmt.Errorf("%w: batch row %d has no logits", engine.ErrInvalidInput, i)
	}
	return nil
}

// rawLogits is a view of row i inside llama.cpp's output buffer, valid until
// the next Decode.
func (c *Context) rawLogits(i int) ([]float32, error) {
	if err := c.row(i); err != nil {
		return nil, err
	}
	p := C.llama_get_logits_ith(c.lc, C.int32_t(i))
	if p == nil {
		return nil, fmt.Errorf("llamacpp: no logits for row %d", i)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(p)), c.vocab), nil
}

// Logits implements engine.Context.
func (c *Context) Logits(i int, dst []float32) ([]float32, error) {
	raw, err := c.rawLogits(i)
	if err != nil {
		return dst, err
	}
	return append(dst[:0], raw...), nil
}

// TopK implements engine.Context, reading llama.cpp's buffer in place.
func (c *Context) TopK(i, k int, dst []engine.TokenLogit) ([]engine.TokenLogit, error) {
	raw, err := c.rawLogits(i)
	if err != nil {
		return dst, err
	}
	return engine.TopK(raw, k, dst), nil
}

// Embedding implements engine.Context.
func (c *Context) Embedding(i int, dst []float32) ([]float32, error) {
	if !c.opts.Embeddings {
		return dst, fmt.Errorf("%w: context created without embeddings", engine.ErrInvalidInput)
	}
	if err := c.row(i); err != nil {
		return dst, err
	}
	p := C.llama_get_embeddings_ith(c.lc, C.int32_t(i))
	if p == nil {
		return dst, fmt.Errorf("llamacpp: no embedding for row %d", i)
	}
	return append(dst[:0], unsafe.Slice((*float32)(unsafe.Pointer(p)), c.model.info.EmbedDim)...), nil
}

// SeqScore implements engine.SeqScorer: the score a ranking model gave
// sequence seq of the last Decode.
func (c *Context) SeqScore(seq int) (float32, error) {
	if !c.opts.Embeddings || c.model.info.Pooling != "rank" {
		return 0, fmt.Errorf("%w: not a ranking model's context with embeddings", engine.ErrInvalidInput)
	}
	if c.closed {
		return 0, engine.ErrClosed
	}
	if seq < 0 || seq >= c.opts.MaxSeqs {
		return 0, fmt.Errorf("%w: sequence %d of %d", engine.ErrInvalidInput, seq, c.opts.MaxSeqs)
	}
	p := C.llama_get_embeddings_seq(c.lc, C.llama_seq_id(seq))
	if p == nil {
		return 0, fmt.Errorf("llamacpp: no score for sequence %d", seq)
	}
	return *(*float32)(unsafe.Pointer(p)), nil
}

// SeqLen implements engine.Context.
func (c *Context) SeqLen(seq int) int { return c.lens.Len(seq) }

// Truncate implements engine.Context.
func (c *Context) Truncate(seq, pos int) error {
	if c.closed {
		return engine.ErrClosed
	}
	if err := c.lens.Truncate(seq, pos); err != nil {
		return err
	}
	if !C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(pos), -1) {
		return fmt.Errorf("llamacpp: could not remove positions %d.. of sequence %d", pos, seq)
	}
	return nil
}

// SeqState implements engine.Context with llama.cpp's sequence state.
func (c *Context) SeqState(seq int) ([]byte, error) {
	if c.closed {
		return nil, engine.ErrClosed
	}
	if err := c.hasMemory(); err != nil {
		return nil, err
	}
	if seq < 0 || seq >= c.opts.MaxSeqs || c.lens.Len(seq) == 0 {
		return nil, fmt.Errorf("%w: no state in sequence %d", engine.ErrInvalidInput, seq)
	}
	size := C.llama_state_seq_get_size(c.lc, C.llama_seq_id(seq))
	var buf []byte
	if c.model.oneCache {
		c.scratch = sized(c.scratch, int(size))
		buf = c.scratch
	} else {
		buf = make([]byte, size)
	}
	n := C.llama_state_seq_get_data(c.lc, (*C.uint8_t)(unsafe.Pointer(&buf[0])), size, C.llama_seq_id(seq))
	if n == 0 {
		return nil, fmt.Errorf("llamacpp: could not save the state of sequence %d", seq)
	}
	if !c.model.oneCache {
		return buf[:n], nil
	}
	// The state is returned, so it cannot stay in scratch.
	state, err := portableSeqState(buf[:n], c.streams())
	if err != nil {
		return nil, fmt.Errorf("llamacpp: sequence %d: %w", seq, err)
	}
	return state, nil
}

// seqStateMagic opens a sequence state that names no stream count.
//
// llama.cpp writes a sequence's state as its magic number, the sequence's
// id, the context's stream count (one stream per sequence without a
// unified KV cache, so MaxSeqs), then a cell count for every stream, all
// zero but that of the sequence's own, which its cells follow; and it
// loads a state only into a context of the same stream count ("n_stream
// mismatch"). Two daemons, or a cache and the context that reads it,
// rarely agree on MaxSeqs, so SeqState keeps the magic number and only the
// one stream's count and cells, and SetSeqState writes them back as stream
// 0 of this context's count: llama.cpp loads a stream's cells into the
// destination sequence's own stream whichever stream they came from (and
// reads the id it was saved from only to skip it).
var seqStateMagic = []byte("dragon-seq-state-1\n")

// streams is the stream count llama.cpp gave this context.
func (c *Context) streams() int {
	if c.unified {
		return 1
	}
	return c.opts.MaxSeqs
}

// portableSeqState strips raw's sequence id, stream count and empty
// streams.
func portableSeqState(raw []byte, streams int) ([]byte, error) {
	const head = 12 // magic, sequence id, stream count
	if len(raw) < head || binary.LittleEndian.Uint32(raw[8:]) != uint32(streams) {
		return nil, fmt.Errorf("the state does not name the context's %d streams", streams)
	}
	off, k := head, 0
	for ; k < streams; k++ {
		if off+4 > len(raw) {
			return nil, fmt.Errorf("the state ends after %d empty streams", k)
		}
		if binary.LittleEndian.Uint32(raw[off:]) != 0 {
			break
		}
		off += 4
	}
	end := len(raw) - 4*(streams-k-1)
	if k == streams || end <= off+4 {
		return nil, fmt.Errorf("the state holds no cells")
	}
	for i := end; i < len(raw); i += 4 {
		if binary.LittleEndian.Uint32(raw[i:]) != 0 {
			return nil, fmt.Errorf("the state holds cells in more than one stream")
		}
	}
	out := make([]byte, 0, len(seqStateMagic)+4+end-off)
	out = append(append(out, seqStateMagic...), raw[:4]...)
	return append(out, raw[off:end]...), nil
}

// rawSeqState is the inverse of portableSeqState for a context of streams,
// written into buf (grown if it is too small).
func rawSeqState(buf, state []byte, streams int) ([]byte, bool) {
	body, ok := bytes.CutPrefix(state, seqStateMagic)
	if !ok || len(body) < 8 {
		return nil, false
	}
	raw := sized(buf, 12+len(body)-4+4*(streams-1))
	copy(raw, body[:4]) // llama.cpp's magic
	binary.LittleEndian.PutUint32(raw[4:], 0)
	binary.LittleEndian.PutUint32(raw[8:], uint32(streams))
	cells := copy(raw[12:], body[4:])
	clear(raw[12+cells:]) // the streams after the first are empty
	return raw, true
}

// sized returns buf resliced to n bytes, or a new buffer if it is smaller.
func sized(buf []byte, n int) []byte {
	if cap(buf) < n {
		return make([]byte, n)
	}
	return buf[:n]
}

// SetSeqState implements engine.Context.
func (c *Context) SetSeqState(seq int, state []byte, n int) error {
	if c.closed {
		return engine.ErrClosed
	}
	if err := c.hasMemory(); err != nil {
		return err
	}
	if len(state) == 0 {
		return fmt.Errorf("%w: empty sequence state", engine.ErrInvalidInput)
	}
	if c.model.oneCache {
		raw, ok := rawSeqState(c.scratch, state, c.streams())
		if !ok {
			return fmt.Errorf("%w: not a sequence state of this engine (%d bytes)", engine.ErrInvalidInput, len(state))
		}
		c.scratch, state = raw, raw
	}
	if err := c.lens.Load(seq, n); err != nil {
		return err
	}
	read := C.llama_state_seq_set_data(c.lc, (*C.uint8_t)(unsafe.Pointer(&state[0])), C.size_t(len(state)), C.llama_seq_id(seq))
	if read == 0 || int(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq))) != n-1 {
		C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), 0, -1)
		_ = c.lens.Truncate(seq, 0)
		return fmt.Errorf("%w: the state does not load as %d positions of sequence %d (another model, or other context options?)", engine.ErrInvalidInput, n, seq)
	}
	return nil
}

// CopySeq implements engine.Context. Without a unified KV cache, sequences
// live in separate streams and only whole sequences can be copied.
func (c *Context) CopySeq(src, dst, p0, p1 int) error {
	if c.closed {
		return engine.ErrClosed
	}
	if err := c.hasMemory(); err != nil {
		return err
	}
	if !c.unified && (p0 != 0 || p1 != c.lens.Len(src)) {
		return fmt.Errorf("%w: partial copy [%d, %d) of sequence %d needs a unified KV cache", engine.ErrInvalidInput, p0, p1, src)
	}
	if err := c.lens.Copy(src, dst, p0, p1); err != nil {
		return err
	}
	if c.unified {
		C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), C.llama_pos(p0), C.llama_pos(p1))
	} else {
		C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), -1, -1)
	}
	return nil
}

// hasMemory refuses state operations on an encoder's context, which
// keeps no KV cache between passes.
func (c *Context) hasMemory() error {
	if c.mem == nil {
		return fmt.Errorf("%w: %s keeps no KV state (an encoder)", engine.ErrInvalidInput, c.model.info.Arch)
	}
	return nil
}

// LastDecodeInside is how long the last Decode spent inside llama_decode.
func (c *Context) LastDecodeInside() time.Duration {
	return time.Duration(C.dragon_last_decode_ns(c.c))
}

// Options implements engine.Context.
func (c *Context) Options() engine.ContextOptions { return c.opts }

// VocabSize implements engine.Context.
func (c *Context) VocabSize() int { return c.vocab }

// Close implements engine.Context.
func (c *Context) Close() error {
	if !c.closed {
		c.closed = true
		C.dragon_ctx_free(c.c)
		c.done.Close()
		c.model.contexts.Add(-1)
	}
	return nil
}

var errBackend error

func initBackend() {
	if errBackend = checkGGML(linkedGGML()); errBackend != nil {
		return
	}
	C.llama_backend_init()
	C.dragon_log_install()
}

// checkGGML refuses a linked library other than the pinned one: the shim
// and the state format are written against its headers.
func checkGGML(version string) error {
	if version != ggmlVersion {
		return fmt.Errorf("llamacpp: linked against ggml %s, this build needs %s (llama.cpp 0c1e57098): rebuild with make deps", version, ggmlVersion)
	}
	return nil
}

// linkedGGML is the version the linked ggml reports.
func linkedGGML() string { return C.GoString(C.ggml_version()) }

// logLevel carries a continued line's level (GGML_LOG_LEVEL_CONT). Atomic:
// contexts on several threads may log at once (their lines may then
// interleave, as llama.cpp's own stderr logger's do).
var logLevel atomic.Int64

// dragonLlamaLog receives llama.cpp's log text (shim.c has dropped the
// lines of aborted decodes) and writes it to stderr as it comes, when
// slog's default handler is enabled at its level: debug lines only when
// debugging, and the rest unless the log is quieter.
//
//export dragonLlamaLog
func dragonLlamaLog(level C.int, text *C.char) {
	if level != C.GGML_LOG_LEVEL_CONT {
		logLevel.Store(int64(4 * (int(level) - C.GGML_LOG_LEVEL_INFO)))
	}
	if slog.Default().Enabled(context.Background(), slog.Level(logLevel.Load())) {
		fmt.Fprint(os.Stderr, C.GoString(text))
	}
}
