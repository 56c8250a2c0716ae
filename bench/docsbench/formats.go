package docsbench

import (
	"os"
	"path/filepath"
	"slices"

	"github.com/dragon-rag/dragon/bench/textscore"
	"github.com/dragon-rag/dragon/extract"
)

// FormatScore is extraction's quality on one format's real files, against
// the reference texts make formats made (pdftotext, w3m, python-docx).
type FormatScore struct {
	Files    int     `json:"files"`
	Scored   int     `json:"scored"` // with a reference text holding words
	Failed   int     `json:"failed"` // of the scored, unreadable
	MedianF1 float64 `json:"median_f1"`
	MinF1    float64 `json:"min_f1"`
}

// Formats scores extraction on the files under dir (data/formats).
func Formats(dir string) (map[string]FormatScore, error) {
	out := map[string]FormatScore{}
	for _, sub := range []string{"pdf", "html", "docx"} {
		paths, err := filepath.Glob(filepath.Join(dir, sub, "*"))
		if err != nil {
			return nil, err
		}
		var s FormatScore
		var f1s []float64
		for _, p := range paths {
			data, err := os.ReadFile(p)
			if err != nil {
				return nil, err
			}
			s.Files++
			ref, err := os.ReadFile(filepath.Join(dir, "ref", filepath.Base(p)+".txt"))
			if err != nil || len(textscore.Words(string(ref))) == 0 {
				continue
			}
			s.Scored++
			doc, err := extract.File(extract.Detect(p, data), data, extract.Limits{})
			if err != nil {
				s.Failed++
				f1s = append(f1s, 0)
				continue
			}
			_, _, f := textscore.F1(doc.Text, string(ref))
			f1s = append(f1s, f)
		}
		if len(f1s) > 0 {
			slices.Sort(f1s)
			s.MedianF1, s.MinF1 = f1s[len(f1s)/2], f1s[0]
		}
		out[sub] = s
	}
	return out, nil
}
