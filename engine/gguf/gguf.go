// Package gguf reads the metadata of GGUF model files, in pure Go, for what
// llama.cpp's API does not expose: the tokenizer's merges and its other
// array-valued keys.
package gguf

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"slices"
	"strings"
)

// ErrFormat marks a file that is not GGUF (v2 or v3) or is cut short.
var ErrFormat = errors.New("gguf: bad format")

// Value types of GGUF metadata (gguf_type in ggml's gguf.h).
const (
	typeUint8 = iota
	typeInt8
	typeUint16
	typeInt16
	typeUint32
	typeInt32
	typeFloat32
	typeBool
	typeString
	typeArray
	typeUint64
	typeInt64
	typeFloat64
)

// scalarSize is the encoded size of a fixed-size type (0: not one).
func scalarSize(t uint32) int {
	switch t {
	case typeUint8, typeInt8, typeBool:
		return 1
	case typeUint16, typeInt16:
		return 2
	case typeUint32, typeInt32, typeFloat32:
		return 4
	case typeUint64, typeInt64, typeFloat64:
		return 8
	}
	return 0
}

// maxString bounds one string's length, so a corrupt length fails rather
// than asking for gigabytes.
const maxString = 1 << 24

// TokenizerHash is the SHA-256, in hex, of every "tokenizer.ggml." key of
// the file (tokens, token types, merges, the special token ids, the
// tokenizer's kind and pre-tokenizer) with its type and value as encoded,
// in key order. Two files with the same hash tokenize text alike and
// number the same tokens alike, whatever their weights; the chat template
// (tokenizer.chat_template) is not part of it.
func TokenizerHash(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("gguf: %w", err)
	}
	defer f.Close()
	r := &reader{r: bufio.NewReaderSize(f, 1<<20)}
	n, err := r.header()
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	type keyed struct {
		key string
		sum []byte
	}
	var keys []keyed
	for range n {
		key, err := r.string(nil)
		if err != nil {
			return "", fmt.Errorf("%s: metadata key: %w", path, err)
		}
		var h hash.Hash
		if strings.HasPrefix(string(key), "tokenizer.ggml.") {
			h = sha256.New()
		}
		if err := r.value(h); err != nil {
			return "", fmt.Errorf("%s: metadata %q: %w", path, key, err)
		}
		if h != nil {
			keys = append(keys, keyed{string(key), h.Sum(nil)})
		}
	}
	slices.SortFunc(keys, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	all := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(all, "%d:%s", len(k.key), k.key)
		all.Write(k.sum)
	}
	return fmt.Sprintf("%x", all.Sum(nil)), nil
}

// Tensor is where one tensor's data lies in a GGUF file.
type Tensor struct {
	Name string
	// Offset is from the start of the file; Size runs to the next
	// tensor's data (its alignment padding included) or the file's end.
	Offset, Size int64
}

// defaultAlignment is GGUF's data alignment when general.alignment is not
// set.
const defaultAlignment = 32

// Tensors lists the file's tensors in the order of their data.
func Tensors(path string) ([]Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	r := &reader{r: bufio.NewReaderSize(f, 1<<20)}
	nt, nk, err := r.counts()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	align := uint64(defaultAlignment)
	for range nk {
		key, err := r.string(nil)
		if err != nil {
			return nil, fmt.Errorf("%s: metadata key: %w", path, err)
		}
		if string(key) == "general.alignment" {
			t, err := r.uint(4, nil)
			if err != nil {
				return nil, err
			}
			if t != typeUint32 {
				return nil, fmt.Errorf("%s: %w: general.alignment of type %d", path, ErrFormat, t)
			}
			if align, err = r.uint(4, nil); err != nil {
				return nil, err
			}
			if align == 0 {
				return nil, fmt.Errorf("%s: %w: general.alignment 0", path, ErrFormat)
			}
			continue
		}
		if err := r.value(nil); err != nil {
			return nil, fmt.Errorf("%s: metadata %q: %w", path, key, err)
		}
	}
	out := make([]Tensor, 0, min(nt, 1<<16))
	for range nt {
		name, err := r.string(nil)
		if err != nil {
			return nil, fmt.Errorf("%s: tensor name: %w", path, err)
		}
		dims, err := r.uint(4, nil)
		if err != nil {
			return nil, err
		}
		if err := r.skip(int64(dims)*8+4, nil); err != nil { // the dims and the type
			return nil, err
		}
		off, err := r.uint(8, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, Tensor{Name: string(name), Offset: int64(off)})
	}
	data := int64((uint64(r.pos) + align - 1) / align * align)
	slices.SortFunc(out, func(a, b Tensor) int { return int(a.Offset - b.Offset) })
	for i := range out {
		end := st.Size() - data
		if i+1 < len(out) {
			end = out[i+1].Offset
		}
		out[i].Size = end - out[i].Offset
		out[i].Offset += data
		if out[i].Size < 0 || out[i].Offset+out[i].Size > st.Size() {
			return nil, fmt.Errorf("%s: %w: tensor %q lies outside the file", path, ErrFormat, out[i].Name)
		}
	}
	return out, nil
}

// reader decodes GGUF's little-endian metadata, copying what it reads into
// a hash when one is given, and counting the bytes it consumed.
type reader struct {
	r   *bufio.Reader
	buf [8]byte
	pos int64
}

// header checks the magic and version and returns the number of keys.
func (r *reader) header() (uint64, error) {
	_, keys, err := r.counts()
	return keys, err
}

// counts checks the magic and version and returns the numbers of tensors
// and of keys.
func (r *reader) counts() (tensors, keys uint64, err error) {
	var magic [4]byte
	if _, err := io.ReadFull(r.r, magic[:]); err != nil || !bytes.Equal(magic[:], []byte("GGUF")) {
		return 0, 0, fmt.Errorf("%w: not a GGUF file", ErrFormat)
	}
	r.pos += 4
	v, err := r.uint(4, nil)
	if err != nil {
		return 0, 0, err
	}
	if v != 2 && v != 3 {
		return 0, 0, fmt.Errorf("%w: version %d (2 or 3 supported)", ErrFormat, v)
	}
	if tensors, err = r.uint(8, nil); err != nil {
		return 0, 0, err
	}
	keys, err = r.uint(8, nil)
	return tensors, keys, err
}

func (r *reader) uint(size int, h hash.Hash) (uint64, error) {
	b := r.buf[:size]
	if _, err := io.ReadFull(r.r, b); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	r.pos += int64(size)
	if h != nil {
		h.Write(b)
	}
	switch size {
	case 4:
		return uint64(binary.LittleEndian.Uint32(b)), nil
	default:
		return binary.LittleEndian.Uint64(b), nil
	}
}

// string reads a length-prefixed string; with a hash it is hashed and not
// returned.
func (r *reader) string(h hash.Hash) ([]byte, error) {
	n, err := r.uint(8, h)
	if err != nil {
		return nil, err
	}
	if n > maxString {
		return nil, fmt.Errorf("%w: a string of %d bytes", ErrFormat, n)
	}
	r.pos += int64(n)
	if h != nil {
		if _, err := io.CopyN(h, r.r, int64(n)); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrFormat, err)
		}
		return nil, nil
	}
	s := make([]byte, n)
	if _, err := io.ReadFull(r.r, s); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFormat, err)
	}
	return s, nil
}

// value reads (or skips, without a hash) one typed value.
func (r *reader) value(h hash.Hash) error {
	t, err := r.uint(4, h)
	if err != nil {
		return err
	}
	return r.typed(uint32(t), h)
}

func (r *reader) typed(t uint32, h hash.Hash) error {
	if size := scalarSize(t); size > 0 {
		return r.skip(int64(size), h)
	}
	switch t {
	case typeString:
		if h == nil {
			n, err := r.uint(8, nil)
			if err != nil {
				return err
			}
			return r.skip(int64(n), nil)
		}
		_, err := r.string(h)
		return err
	case typeArray:
		et, err := r.uint(4, h)
		if err != nil {
			return err
		}
		n, err := r.uint(8, h)
		if err != nil {
			return err
		}
		if size := scalarSize(uint32(et)); size > 0 {
			return r.skip(int64(n)*int64(size), h)
		}
		for range n {
			if err := r.typed(uint32(et), h); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("%w: unknown value type %d", ErrFormat, t)
}

func (r *reader) skip(n int64, h hash.Hash) error {
	w := io.Discard
	if h != nil {
		w = h
	}
	if _, err := io.CopyN(w, r.r, n); err != nil {
		return fmt.Errorf("%w: %w", ErrFormat, err)
	}
	r.pos += n
	return nil
}
