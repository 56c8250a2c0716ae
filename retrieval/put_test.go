package retrieval

import (
	"archive/zip"
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/dragon-rag/dragon/sources"
)

// newEmptyIndex builds a dense index of no files.
func newEmptyIndex(t *testing.T) (*Index, string, Options) {
	t.Helper()
	opts := Options{Tokenizer: newWordTokenizer(), Embedder: newSynonymEmbedder(), Chunk: ChunkOptions{Tokens: 16}}
	dir := filepath.Join(t.TempDir(), "index")
	ix, _, err := Build(t.Context(), dir, opts)
	require.NoError(t, err)
	return ix, dir, opts
}

// bm25Sources are the sources of the passages a BM25 search finds.
func bm25Sources(t *testing.T, ix *Index, query string) []string {
	t.Helper()
	hits, err := ix.Search(t.Context(), query, 10, ModeBM25)
	require.NoError(t, err)
	var out []string
	for _, h := range hits {
		out = append(out, h.Passage.Source)
	}
	return out
}

const testMbox = `From a@example.com Mon Jan  1 00:00:00 2001
From: Ann <a@example.com>
Subject: the lighthouse keeper
Date: Mon, 1 Jan 2001 00:00:00 +0000

The lighthouse keeper painted the lamp room blue.

From b@example.com Tue Jan  2 00:00:00 2001
From: Bob <b@example.com>
Subject: glacier trip
Date: Tue, 2 Jan 2001 00:00:00 +0000

We walked across the glacier at dawn.
`

func TestPutListDelete(t *testing.T) {
	ix, _, _ := newEmptyIndex(t)
	defer ix.Close()
	ctx := t.Context()

	info, err := ix.Put(ctx, "notes/otters.txt", []byte("Sea otters hold hands while they sleep."), map[string]string{"tag": "animals"})
	require.NoError(t, err)
	assert.Equal(t, sources.DocumentID("notes/otters.txt"), info.ID)
	assert.Equal(t, StatusEmbedding, info.Status, "BM25 first, vectors in the background")
	assert.Equal(t, 1, info.Passages)
	assert.Equal(t, 0, info.Embedded)
	assert.Equal(t, []string{"notes/otters.txt"}, bm25Sources(t, ix, "otters sleep"), "searchable once Put returns")
	hits, err := ix.Search(ctx, "otters sleep", 1, ModeBM25)
	require.NoError(t, err)
	assert.Equal(t, "animals", hits[0].Passage.Meta["tag"], "the upload's metadata is the passages'")

	n, err := ix.EmbedPending(ctx, 100)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	info, ok := ix.Document(info.ID)
	require.True(t, ok)
	assert.Equal(t, StatusIndexed, info.Status)
	assert.Equal(t, 1, info.Embedded)
	hits, err = ix.Search(ctx, "otters", 1, ModeDense)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, "notes/otters.txt", hits[0].Passage.Source)

	// The same bytes again: nothing to do. Other bytes: a replacement.
	again, err := ix.Put(ctx, "notes/otters.txt", []byte("Sea otters hold hands while they sleep."), map[string]string{"tag": "animals"})
	require.NoError(t, err)
	assert.True(t, again.Unchanged)
	_, err = ix.Put(ctx, "notes/otters.txt", []byte("Sea otters use stones as tools."), nil)
	require.NoError(t, err)
	assert.Empty(t, bm25Sources(t, ix, "sleep"), "the old version is gone")
	assert.Equal(t, []string{"notes/otters.txt"}, bm25Sources(t, ix, "stones tools"))

	// An mbox: one document of two parts; a part can go alone.
	box, err := ix.Put(ctx, "mail/inbox.mbox", []byte(testMbox), nil)
	require.NoError(t, err)
	assert.Equal(t, 2, box.Parts)
	assert.Equal(t, "mbox", box.Kind)
	assert.Equal(t, "the lighthouse keeper", box.Title)
	assert.Equal(t, []string{"mail/inbox.mbox#2"}, bm25Sources(t, ix, "glacier"))
	part := sources.DocumentID("mail/inbox.mbox#2")
	got, ok := ix.Document(part)
	require.True(t, ok, "a part's id finds its file")
	assert.Equal(t, box.ID, got.ID)
	n, err = ix.DeleteDocument(part)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Empty(t, bm25Sources(t, ix, "glacier"), "deleted, gone at once")
	assert.Equal(t, []string{"mail/inbox.mbox#1"}, bm25Sources(t, ix, "lighthouse"))

	// A file that cannot be read is listed as failed, with the reason.
	bad, err := ix.Put(ctx, "scan.bin", []byte{0x89, 'P', 'N', 'G', 0, 0, 0, 1}, nil)
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, bad.Status)
	assert.Contains(t, bad.Error, "unsupported file type")
	empty, err := ix.Put(ctx, "empty.txt", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, empty.Status)
	assert.Contains(t, empty.Error, "empty")
	// A failed new version leaves the good one in place.
	keep, err := ix.Put(ctx, "notes/otters.txt", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, keep.Status)
	assert.Equal(t, []string{"notes/otters.txt"}, bm25Sources(t, ix, "stones tools"))

	var listed []string
	for _, d := range ix.Documents() {
		listed = append(listed, d.Source+"="+d.Status)
	}
	assert.Equal(t, []string{"empty.txt=failed", "mail/inbox.mbox=embedding", "notes/otters.txt=embedding", "scan.bin=failed"}, listed)

	n, err = ix.DeleteDocument(box.ID)
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Empty(t, bm25Sources(t, ix, "lighthouse"))
	_, err = ix.DeleteDocument(box.ID)
	require.ErrorIs(t, err, ErrNotIndexed)
}

func TestCleanName(t *testing.T) {
	for _, tc := range []struct{ name, want, err string }{
		{"notes/a.txt", "notes/a.txt", ""},
		{`win\dir\b.md`, "win/dir/b.md", ""},
		{"a//b.txt", "a/b.txt", ""},
		{"", "", "empty"},
		{"../etc/passwd", "", `".."`},
		{"a/../../b", "", `".."`},
		{"./a", "", `"."`},
		{"a\x00b", "", "control character"},
		{"line\nbreak", "", "control character"},
		{"/etc/passwd", "", "absolute"},
		{`C:\x`, "", "absolute"},
		{"box#3", "", `"#"`},
		{"\xff\xfe", "", "UTF-8"},
		{strings.Repeat("a", MaxNameBytes+1), "", "longer than"},
	} {
		got, err := CleanName(tc.name)
		if tc.err != "" {
			require.ErrorIs(t, err, ErrBadName, tc.name)
			assert.ErrorContains(t, err, tc.err, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got)
	}
}

// crash drops an open index as a killed process would: no checkpoint, no
// flush, only the file handles closed.
func crash(t *testing.T, ix *Index) {
	t.Helper()
	require.NoError(t, ix.bm25.close())
	require.NoError(t, ix.journal.close())
	ix.closed = true
}

func TestJournalReplaysWhatTheSnapshotLacks(t *testing.T) {
	ix, dir, opts := newEmptyIndex(t)
	ctx := t.Context()
	_, err := ix.Put(ctx, "a.txt", []byte("The kettle whistled in the kitchen."), nil)
	require.NoError(t, err)
	_, err = ix.Put(ctx, "b.txt", []byte("Penguins huddle against the wind."), nil)
	require.NoError(t, err)
	_, err = ix.EmbedPending(ctx, 1) // a.txt's vector, in memory only
	require.NoError(t, err)
	_, err = ix.DeleteDocument(sources.DocumentID("b.txt"))
	require.NoError(t, err)
	_, err = ix.Put(ctx, "c.txt", []byte("The ferry left at noon."), nil)
	require.NoError(t, err)
	gen := ix.Stats().Manifest.Generation
	crash(t, ix)

	ix, err = Open(dir, opts)
	require.NoError(t, err)
	assert.Equal(t, gen, ix.Stats().Manifest.Generation, "nothing checkpointed before the crash")
	assert.Equal(t, []string{"a.txt"}, bm25Sources(t, ix, "kettle"))
	assert.Empty(t, bm25Sources(t, ix, "penguins"), "the delete replays too")
	assert.Equal(t, []string{"c.txt"}, bm25Sources(t, ix, "ferry"))
	assert.Equal(t, 2, ix.Pending(), "vectors not checkpointed are computed again")

	// A torn record at the tail (a crash mid-append) is cut off.
	require.NoError(t, ix.Close())
	f, err := os.OpenFile(filepath.Join(dir, journalFile), os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.Write([]byte{200, 0, 0, 0, 1, 2, 3, 4, '{', '"'})
	require.NoError(t, err)
	require.NoError(t, f.Close())
	ix, err = Open(dir, opts)
	require.NoError(t, err)
	assert.Equal(t, []string{"c.txt"}, bm25Sources(t, ix, "ferry"))
	_, err = ix.Put(ctx, "d.txt", []byte("Owls hunt at night."), nil)
	require.NoError(t, err)
	crash(t, ix)
	ix, err = Open(dir, opts)
	require.NoError(t, err)
	defer ix.Close()
	assert.Equal(t, []string{"d.txt"}, bm25Sources(t, ix, "owls"), "the record after the cut replays")
}

// TestAckedPutsSurviveKill9 kills a process putting documents at random
// moments; every document it acknowledged must be there after, whole, and
// no document may be there in part.
func TestAckedPutsSurviveKill9(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "index")
	opts := Options{Tokenizer: newWordTokenizer(), Chunk: ChunkOptions{Tokens: 16}}
	ix, _, err := Build(t.Context(), dir, opts)
	require.NoError(t, err)
	require.NoError(t, ix.Close())

	acked := map[int]bool{}
	next := 0
	for cycle := range 4 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "DRAGON_PUT_CHILD="+dir, "DRAGON_PUT_FROM="+strconv.Itoa(next))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		sc := bufio.NewScanner(out)
		kill := time.After(time.Duration(150+100*cycle) * time.Millisecond)
	read:
		for sc.Scan() {
			if n, err := strconv.Atoi(strings.TrimPrefix(sc.Text(), "acked ")); err == nil {
				acked[n] = true
				next = n + 1
			}
			select {
			case <-kill:
				break read
			default:
			}
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		cmd.Wait()

		ix, err := Open(dir, opts)
		require.NoError(t, err, "cycle %d", cycle)
		for n := range acked {
			d, ok := ix.Document(sources.DocumentID(childDocName(n)))
			require.True(t, ok, "cycle %d: acknowledged document %d lost", cycle, n)
			require.Equal(t, childPassages(t, n), d.Passages, "cycle %d: document %d", cycle, n)
		}
		for _, d := range ix.Documents() {
			require.Equal(t, childPassages(t, childDocNumber(d.Source)), d.Passages, "cycle %d: %s is there in part", cycle, d.Source)
			next = max(next, childDocNumber(d.Source)+1)
		}
		require.NoError(t, ix.Close())
	}
	t.Logf("%d documents acknowledged over 4 kills", len(acked))
	require.NotEmpty(t, acked, "the child never acknowledged a document")
}

func childDocName(n int) string { return fmt.Sprintf("doc-%06d.txt", n) }

func childDocNumber(source string) int {
	n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(source, "doc-"), ".txt"))
	return n
}

// childDocText is document n: a few passages long, so that a torn add
// would show as a document with too few.
func childDocText(n int) string {
	return strings.Repeat(fmt.Sprintf("doc%d alpha beta gamma delta epsilon zeta eta theta ", n), 6)
}

// childPassages is how many passages document n has when whole.
func childPassages(t *testing.T, n int) int {
	spans, err := chunkText(newWordTokenizer(), childDocText(n), ChunkOptions{Tokens: 16}.withDefaults())
	require.NoError(t, err)
	require.Greater(t, len(spans), 1)
	return len(spans)
}

// putChild is the killed process of TestAckedPutsSurviveKill9: it puts
// documents and prints each acknowledgement.
func putChild(dir string, from int) {
	ix, err := Open(dir, Options{Tokenizer: newWordTokenizer()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for n := from; ; n++ {
		if _, err := ix.Put(context.Background(), childDocName(n), []byte(childDocText(n)), nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Printf("acked %d\n", n)
	}
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("DRAGON_PUT_CHILD"); dir != "" {
		from, _ := strconv.Atoi(os.Getenv("DRAGON_PUT_FROM"))
		putChild(dir, from)
	}
	// bleve's analysis workers are process-wide and never stop.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/blevesearch/bleve_index_api.AnalysisWorker"))
}

func TestPutAllIsOneChange(t *testing.T) {
	ix, _, _ := newEmptyIndex(t)
	defer ix.Close()
	var files []PutFile
	for i := range 200 {
		files = append(files, PutFile{Name: fmt.Sprintf("n/%03d.txt", i), Data: []byte(fmt.Sprintf("note number%d about walruses", i))})
	}
	files = append(files, PutFile{Name: "../escape.txt", Data: []byte("x")}, PutFile{Name: "n/000.txt", Data: []byte("the first note, rewritten about seals")})
	seq := ix.journal.seq
	out, err := ix.PutAll(t.Context(), files)
	require.NoError(t, err)
	require.Len(t, out, len(files))
	assert.Equal(t, seq+2, ix.journal.seq, "one change, and one more for the name given twice")
	for _, d := range out[:200] {
		assert.Equal(t, StatusEmbedding, d.Status, d.Source)
	}
	assert.Equal(t, StatusFailed, out[200].Status)
	assert.Contains(t, out[200].Error, `".."`)
	assert.Equal(t, StatusEmbedding, out[201].Status)
	assert.Equal(t, []string{"n/000.txt"}, bm25Sources(t, ix, "seals"))
	assert.Empty(t, bm25Sources(t, ix, "number0"), "the later version replaced the earlier")
	assert.Equal(t, []string{"n/137.txt"}, bm25Sources(t, ix, "number137"))
	assert.Len(t, ix.Documents(), 200)
}

func TestPutHTMLAndDOCX(t *testing.T) {
	ix, _, _ := newEmptyIndex(t)
	defer ix.Close()
	page := `<html><head><title>Tide tables</title><style>.x{color:red}</style></head><body>
<nav>Home | Archive | Login</nav><article><p>High tide at Brancaster is at 06:12 on Saturday.</p></article>
<script>trackVisitor()</script></body></html>`
	d, err := ix.Put(t.Context(), "web/tides.html", []byte(page), nil)
	require.NoError(t, err)
	require.NotEqual(t, StatusFailed, d.Status, d.Error)
	assert.Equal(t, "html", d.Kind)
	assert.Equal(t, "Tide tables", d.Title)
	assert.Equal(t, []string{"web/tides.html"}, bm25Sources(t, ix, "Brancaster tide"))
	assert.Empty(t, bm25Sources(t, ix, "trackVisitor"), "scripts are not text")
	assert.Empty(t, bm25Sources(t, ix, "Archive Login"), "nor navigation")
	assert.Empty(t, bm25Sources(t, ix, "color red"), "nor styles")

	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, err := zw.Create("word/document.xml")
	require.NoError(t, err)
	_, err = w.Write([]byte(`<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>` +
		`<w:tbl><w:tr><w:tc><w:p><w:r><w:t>Ferry</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>Stromness 09:00</w:t></w:r></w:p></w:tc></w:tr></w:tbl>` +
		`</w:body></w:document>`))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	d, err = ix.Put(t.Context(), "trip.docx", buf.Bytes(), nil)
	require.NoError(t, err)
	require.NotEqual(t, StatusFailed, d.Status, d.Error)
	hits, err := ix.Search(t.Context(), "Stromness ferry", 1, ModeBM25)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, "Ferry | Stromness 09:00", hits[0].Passage.Text, "a table row, cells joined")

	bomb := bytes.Repeat([]byte{0}, 1<<20)
	buf.Reset()
	zw = zip.NewWriter(&buf)
	w, err = zw.Create("word/document.xml")
	require.NoError(t, err)
	_, err = w.Write(bomb)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	d, err = ix.Put(t.Context(), "bomb.docx", buf.Bytes(), nil)
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, d.Status)
	assert.Contains(t, d.Error, "expand")
}

// TestMailAttachmentsAreDocuments: a mail's HTML and DOCX attachments are
// documents of their own, linked to the mail, and a mail whose only
// content is an attachment is kept for it; deleting the mail takes them.
func TestMailAttachmentsAreDocuments(t *testing.T) {
	ix, _, _ := newEmptyIndex(t)
	defer ix.Close()
	var doc bytes.Buffer
	zw := zip.NewWriter(&doc)
	w, err := zw.Create("word/document.xml")
	require.NoError(t, err)
	_, err = w.Write([]byte(`<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body><w:p><w:r><w:t>The invoice total is 912 kroner.</w:t></w:r></w:p></w:body></w:document>`))
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	mail := "From: Ann <ann@example.com>\r\nSubject: invoice and menu\r\nDate: Mon, 1 Jan 2001 10:00:00 +0000\r\n" +
		"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=XX\r\n\r\n" +
		"--XX\r\nContent-Type: text/plain\r\n\r\nSee the attachments.\r\n" +
		"--XX\r\nContent-Type: application/vnd.openxmlformats-officedocument.wordprocessingml.document; name=\"inv.docx\"\r\n" +
		"Content-Disposition: attachment; filename=\"inv.docx\"\r\nContent-Transfer-Encoding: base64\r\n\r\n" +
		base64.StdEncoding.EncodeToString(doc.Bytes()) + "\r\n" +
		"--XX\r\nContent-Type: text/html; name=\"menu.html\"\r\nContent-Disposition: attachment; filename=\"menu.html\"\r\n\r\n" +
		"<html><head><title>Menu</title></head><body><nav>skip</nav><p>Smoked herring on rye.</p></body></html>\r\n" +
		"--XX\r\nContent-Type: image/png; name=\"logo.png\"\r\nContent-Disposition: attachment; filename=\"logo.png\"\r\nContent-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n" +
		"--XX--\r\n"
	d, err := ix.Put(t.Context(), "mail/invoice.eml", []byte(mail), nil)
	require.NoError(t, err)
	require.NotEqual(t, StatusFailed, d.Status, d.Error)
	assert.Equal(t, 3, d.Parts, "the body and two attachments; the image carries no text")

	hits, err := ix.Search(t.Context(), "invoice total kroner", 1, ModeBM25)
	require.NoError(t, err)
	require.Len(t, hits, 1)
	assert.Equal(t, "mail/invoice.eml#attachment/1/inv.docx", hits[0].Passage.Source)
	assert.Equal(t, "mail/invoice.eml", hits[0].Passage.Meta["attached_to"])
	assert.Equal(t, "invoice and menu", hits[0].Passage.Meta["subject"])
	assert.Equal(t, "inv.docx", hits[0].Passage.Meta["filename"])
	assert.Equal(t, []string{"mail/invoice.eml#attachment/2/menu.html"}, bm25Sources(t, ix, "smoked herring"))
	assert.Empty(t, bm25Sources(t, ix, "skip"))

	only := "From: Bob <bob@example.com>\r\nSubject: scan\r\nMIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=YY\r\n\r\n" +
		"--YY\r\nContent-Type: text/plain; name=\"notes.txt\"\r\nContent-Disposition: attachment; filename=\"notes.txt\"\r\n\r\nThe boiler was serviced in March.\r\n--YY--\r\n"
	d, err = ix.Put(t.Context(), "mail/only.eml", []byte(only), nil)
	require.NoError(t, err)
	require.NotEqual(t, StatusFailed, d.Status, d.Error)
	assert.Equal(t, []string{"mail/only.eml#attachment/1/notes.txt"}, bm25Sources(t, ix, "boiler serviced"))

	_, err = ix.DeleteDocument(sources.DocumentID("mail/invoice.eml"))
	require.NoError(t, err)
	assert.Empty(t, bm25Sources(t, ix, "smoked herring"), "the mail's attachments go with it")
}

// An index read back from disk keeps one source string and one metadata
// map per document, not a copy per passage (a fifth of its memory).
func TestReopenedPassagesShareTheirDocumentsMetadata(t *testing.T) {
	ix, dir, opts := newEmptyIndex(t)
	mail := "From: Ann <a@example.com>\r\nSubject: the long letter\r\n\r\n" + strings.Repeat("The lighthouse keeper wrote about the storm and the lamp. ", 20)
	_, err := ix.Put(t.Context(), "letter.eml", []byte(mail), nil)
	require.NoError(t, err)
	require.NoError(t, ix.Close())
	ix, err = Open(dir, opts)
	require.NoError(t, err)
	defer ix.Close()
	ps := ix.Passages()
	require.Greater(t, len(ps), 3)
	for _, p := range ps[1:] {
		assert.Equal(t, "the long letter", p.Meta["subject"])
		assert.Equal(t, reflect.ValueOf(ps[0].Meta).UnsafePointer(), reflect.ValueOf(p.Meta).UnsafePointer(), "one map per document")
		assert.Equal(t, unsafe.StringData(ps[0].Source), unsafe.StringData(p.Source), "one source string per document")
	}
}
