package retrieval

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const qpLatin1Mail = "From: =?ISO-8859-1?Q?Andr=E9_M=FCller?= <andre@example.org>\r\n" +
	"To: me@example.org\r\n" +
	"Subject: =?utf-8?B?Q2Fmw6kgbWVldGluZw==?=\r\n" +
	"Date: Thu, 22 Aug 2002 18:26:25 +0700\r\n" +
	"Message-ID: <42@example.org>\r\n" +
	"MIME-Version: 1.0\r\n" +
	"Content-Type: text/plain; charset=iso-8859-1\r\n" +
	"Content-Transfer-Encoding: quoted-printable\r\n" +
	"\r\n" +
	"Let's meet at the caf=E9 on Stra=DFe 5. This line is soft-=\r\n" +
	"wrapped.\r\n"

const alternativeMail = `From: alice@example.org
Subject: Report
MIME-Version: 1.0
Content-Type: multipart/alternative; boundary="XX"

preamble
--XX
Content-Type: text/html; charset=utf-8

<p>HTML version</p>
--XX
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: base64

VGhlIHBsYWluIHZlcnNpb24gb2YgdGhlIHJlcG9y
dCBpcyBoZXJlLg==
--XX--
`

const mixedMail = `From: bob@example.org
Subject: With attachment
Content-Type: multipart/mixed; boundary=outer

--outer
Content-Type: multipart/alternative; boundary=inner

--inner
Content-Type: text/plain

Body text before the attachment.
--inner--
--outer
Content-Type: text/plain; name=secret.txt
Content-Disposition: attachment; filename=secret.txt

attachment text must not be indexed
--outer--
`

const htmlOnlyMail = `From: news@example.org
Subject: Newsletter
Content-Type: text/html; charset=utf-8

<html><head><title>T</title><style>p {color: red}</style></head>
<body><h1>Weekly &amp; news</h1><p>First item.</p><script>alert(1)</script><p>Second item.</p></body></html>
`

func TestParseMessage(t *testing.T) {
	tests := []struct {
		name, raw           string
		subject, from       string
		bodyHas, bodyHasNot []string
	}{
		{"quoted-printable latin1", qpLatin1Mail, "Café meeting", "André Müller <andre@example.org>",
			[]string{"café on Straße 5", "soft-wrapped."}, []string{"=E9", "\r"}},
		{"alternative prefers plain, base64", alternativeMail, "Report", "alice@example.org",
			[]string{"The plain version of the report is here."}, []string{"HTML version"}},
		{"nested multipart skips attachments", mixedMail, "With attachment", "bob@example.org",
			[]string{"Body text before the attachment."}, []string{"attachment text"}},
		{"html only falls back to text", htmlOnlyMail, "Newsletter", "news@example.org",
			[]string{"Weekly & news", "First item.", "Second item."}, []string{"alert", "color", "<p>"}},
		{"broken quoted-printable decodes leniently", "From: x@y\nSubject: rules\nContent-Transfer-Encoding: quoted-printable\n\n" +
			"Title\n======\ncaf=E9 soft=\nbreak =ZZ end\n", "rules", "x@y",
			[]string{"======\n", "café softbreak =ZZ end"}, nil},
		{"truncated multipart keeps its text", "From: x@y\nSubject: cut\nContent-Type: multipart/alternative; boundary=b\n\n" +
			"--b\nContent-Type: text/plain\n\nThe text survives.\n--b\nContent-Type: text/html\n\n<p>cut off", "cut", "x@y",
			[]string{"The text survives."}, nil},
		{"unclosed html head", "From: x@y\nSubject: h\nContent-Type: text/html\n\n<HTML><HEAD><TITLE>T</TITLE><BODY><P>Visible text.</P>", "h", "x@y",
			[]string{"Visible text."}, []string{"T\n"}},
		{"mbox envelope line tolerated", "From alice@example.org  Thu Aug 22 12:36:23 2002\n" + alternativeMail,
			"Report", "alice@example.org", []string{"plain version"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := parseMessage([]byte(tc.raw))
			require.NoError(t, err)
			assert.Equal(t, tc.subject, m.Subject)
			assert.Equal(t, tc.from, m.From)
			for _, s := range tc.bodyHas {
				assert.Contains(t, m.Body, s)
			}
			for _, s := range tc.bodyHasNot {
				assert.NotContains(t, m.Body, s)
			}
		})
	}
}

func TestParseMessageErrors(t *testing.T) {
	for name, raw := range map[string]string{
		"no headers":    "just some words\nwithout a header block",
		"broken base64": "From: a@b\nSubject: x\nContent-Transfer-Encoding: base64\n\n!!!! not base64 @@@@\n",
		"only an image": "From: a@b\nContent-Type: image/png\n\nPNGDATA\n",
		"no boundary":   "From: a@b\nContent-Type: multipart/mixed\n\n--x\n\nhello\n--x--\n",
		"empty body":    "From: a@b\nSubject: nothing\n\n   \n",
	} {
		_, err := parseMessage([]byte(raw))
		assert.Error(t, err, name)
	}
}

func TestMboxThreeMessages(t *testing.T) {
	mbox := "From alice@example.org Mon Jan  1 00:00:00 2024\n" +
		"From: alice@example.org\nSubject: one\n\nFirst message.\n>From the quoted line.\n\n" +
		"From bob@example.org Mon Jan  1 00:00:01 2024\n" +
		"From: bob@example.org\nSubject: two\n\nSecond message.\nFrom here on, not a separator (no blank line before).\n\n" +
		"From carol@example.org Mon Jan  1 00:00:02 2024\n" +
		"From: carol@example.org\nSubject: three\n\nThird message.\n"
	dir := t.TempDir()
	path := filepath.Join(dir, "inbox") // no extension: sniffed
	require.NoError(t, os.WriteFile(path, []byte(mbox), 0o644))

	docs, errs, err := readDocuments(path)
	require.NoError(t, err)
	require.Empty(t, errs)
	require.Len(t, docs, 3)
	for i, want := range []string{"one", "two", "three"} {
		assert.Equal(t, path+"#"+string(rune('1'+i)), docs[i].Source)
		assert.Equal(t, want, docs[i].Meta["subject"])
		assert.Equal(t, KindMail, docs[i].Kind)
	}
	assert.Contains(t, docs[0].Text, "\nFrom the quoted line.", ">From quoting is undone")
	assert.Contains(t, docs[1].Text, "From here on, not a separator")

	ix, _, err := Build(t.Context(), filepath.Join(dir, "idx"), Options{Tokenizer: fakeModel()}, path)
	require.NoError(t, err)
	defer ix.Close()
	assert.Equal(t, []string{path + "#1", path + "#2", path + "#3"}, ix.Sources())
	assert.Equal(t, 3, ix.Stats().Manifest.Sources)
	assert.Equal(t, 1, ix.Stats().Manifest.Files)
}

func TestMboxBadMessageIsSkipped(t *testing.T) {
	mbox := "From a Mon Jan  1 00:00:00 2024\nFrom: a@x\nSubject: good\n\nGood body.\n\n" +
		"From b Mon Jan  1 00:00:00 2024\nnot a header line at all\n\n" +
		"From c Mon Jan  1 00:00:00 2024\nFrom: c@x\nSubject: also good\n\nAnother body.\n"
	path := filepath.Join(t.TempDir(), "x.mbox")
	require.NoError(t, os.WriteFile(path, []byte(mbox), 0o644))
	docs, errs, err := readDocuments(path)
	require.NoError(t, err)
	assert.Len(t, docs, 2)
	require.Len(t, errs, 1)
	assert.Equal(t, path+"#2", errs[0].Path)
}

func TestDetectKind(t *testing.T) {
	tests := []struct {
		name, head string
		want       Kind
		err        bool
	}{
		{"a.md", "# hi", KindMarkdown, false},
		{"a.eml", "anything", KindMail, false},
		{"a.mbox", "anything", KindMbox, false},
		{"a.txt", "\x00\x01", KindText, false},
		{"00001.7c53336b", "Return-Path: <x@y>\nFrom: a@b\nSubject: s\n", KindMail, false},
		{"00002.deadbeef", "From x@y Thu Aug 22\nFrom: a@b\n", KindMbox, false},
		{"README", "Subject: not mail, just one header-looking line\n\nbody", KindText, false},
		{"photo.jpg", "\xff\xd8\xff\xe0\x00\x10JFIF", 0, true},
		{"latin1", "caf\xe9 cr\xe8me", 0, true},
	}
	for _, tc := range tests {
		got, err := detectKind(tc.name, []byte(tc.head))
		if tc.err {
			assert.ErrorIs(t, err, errUnsupported, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.want, got, tc.name)
	}
	assert.Equal(t, "mbox", KindMbox.String())
	assert.True(t, strings.HasPrefix(Kind(0).String(), "unknown"))
}
