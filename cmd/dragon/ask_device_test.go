package main

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dragon-rag/dragon/device"
	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
)

// summaryKeys are the JSON keys of the GenerateSummary fields that scripts
// read under names other than the rule's (the field's own name, a
// Duration's with "_ms"); a field mapped to no key is deliberately left
// out of the JSON.
var summaryKeys = map[protoreflect.Name][]string{
	"finish_reason":          {"finish"},
	"token_latency_mean":     {"per_token_ms"},
	"token_latency_p50":      {"per_token_p50_ms"},
	"token_latency_p95":      {"per_token_p95_ms"},
	"acceptance_rate_device": {"acceptance_device"},
	"acceptance_rate_cloud":  {"acceptance_cloud"},
	"aggregator_switches":    {"switches", "aggregator_switches"},
	"trace":                  nil, // --trace writes it to a file
}

// jsonKeys are fd's keys in the summary JSON.
func jsonKeys(fd protoreflect.FieldDescriptor) []string {
	if keys, ok := summaryKeys[fd.Name()]; ok {
		return keys
	}
	if m := fd.Message(); m != nil && m.FullName() == "google.protobuf.Duration" {
		return []string{string(fd.Name()) + "_ms"}
	}
	return []string{string(fd.Name())}
}

func summaryFields() protoreflect.FieldDescriptors {
	return (&dragonv1.GenerateSummary{}).ProtoReflect().Descriptor().Fields()
}

// asMap is v as a script reads it.
func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	return m
}

// TestSummaryJSONCarriesEveryField: every field of GenerateSummary has a
// key in `dragon ask --json`'s output (so a field added to the proto and
// forgotten in device.SummaryJSON fails here), and every key stands for a
// field.
func TestSummaryJSONCarriesEveryField(t *testing.T) {
	fields := summaryFields()
	for name := range summaryKeys {
		require.NotNil(t, fields.ByName(name), "summaryKeys names %s, which GenerateSummary no longer has", name)
	}
	got := asMap(t, summaryJSON(&dragonv1.GenerateSummary{}))
	want := map[string]bool{}
	for i := range fields.Len() {
		fd := fields.Get(i)
		for _, k := range jsonKeys(fd) {
			assert.Contains(t, got, k, "field %s (%d) has no key %q in the summary JSON: add it to device.SummaryJSON", fd.Name(), fd.Number(), k)
			want[k] = true
		}
	}
	for k := range got {
		assert.True(t, want[k] || derivedSummaryKeys[k], "key %q stands for no GenerateSummary field", k)
	}
}

// derivedSummaryKeys are computed from other fields (per answer token).
var derivedSummaryKeys = map[string]bool{
	"rejected_per_token_device": true, "rejected_per_token_cloud": true,
	"bytes_up_per_token": true, "bytes_down_per_token": true,
}

// TestSummaryJSONValues: a summary with every field set reads back from
// the JSON with each value under its field's key, and the OpenAI front
// end's "dragon" object is the same less the text.
func TestSummaryJSONValues(t *testing.T) {
	ms := func(f float64) *durationpb.Duration {
		return durationpb.New(time.Duration(f * float64(time.Millisecond)))
	}
	sum := &dragonv1.GenerateSummary{
		FinishReason: dragonv1.FinishReason_FINISH_REASON_CONTEXT_FULL, Text: "The lamplighter.", Tokens: 12,
		Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION, Ttft: ms(120), TokenLatencyMean: ms(15.5),
		TokenLatencyP50: ms(14), TokenLatencyP95: ms(30.25), Total: ms(2000),
		AcceptanceRateDevice: 0.75, AcceptanceRateCloud: 0.5, AggregatorSwitches: 3, StaleDrafts: 4,
		BytesSent: 1000, BytesReceived: 2000, TokensPerSecond: 64.5, PassagesDevice: 2, PassagesCloud: 3,
		StepsAggregatedDevice: 5, StepsAggregatedCloud: 6, ForwardPassesDevice: 40, LocalDraftTokensAcceptedDevice: 9,
		Trace:              &dragonv1.Trace{DecodeMsDevice: []float64{1}, AcceptDevice: []bool{true}},
		SecondChoiceDevice: 10, SecondChoiceCloud: 11, RejectedDevice: 13, RejectedCloud: 14,
		Fallback: true, FallbackStep: 7, FallbackReason: "cloud gone", PassagesRestoredDevice: 2, PassagesRestoredCloud: 1,
		LowProbDraftsDevice: []uint64{1, 2, 3}, LowProbDraftsCloud: []uint64{4, 5, 6},
		LowProbCaughtDevice: []uint64{0, 1, 2}, LowProbCaughtCloud: []uint64{1, 1, 3},
		HedgesDevice: 5, HedgesCloud: 8, HedgeHitsDevice: 1, HedgeHitsCloud: 3,
		Sources: []*dragonv1.Source{testSource()}, SourcesPartial: true,
	}
	fields := summaryFields()
	for i := range fields.Len() {
		assert.True(t, sum.ProtoReflect().Has(fields.Get(i)), "the test summary leaves %s unset: set it and add its value below", fields.Get(i).Name())
	}

	got := asMap(t, summaryJSON(sum))
	for _, c := range []struct {
		key  string
		want any
	}{
		{"finish", "context_full"},
		{"text", "The lamplighter."},
		{"tokens", 12.0},
		{"mode", "dragon"},
		{"ttft_ms", 120.0},
		{"per_token_ms", 15.5},
		{"per_token_p50_ms", 14.0},
		{"per_token_p95_ms", 30.25},
		{"total_ms", 2000.0},
		{"acceptance_device", 0.75},
		{"acceptance_cloud", 0.5},
		{"switches", 3.0},
		{"aggregator_switches", 3.0},
		{"stale_drafts", 4.0},
		{"bytes_sent", 1000.0},
		{"bytes_received", 2000.0},
		{"tokens_per_second", 64.5},
		{"passages_device", 2.0},
		{"passages_cloud", 3.0},
		{"steps_aggregated_device", 5.0},
		{"steps_aggregated_cloud", 6.0},
		{"forward_passes_device", 40.0},
		{"local_draft_tokens_accepted_device", 9.0},
		{"second_choice_device", 10.0},
		{"second_choice_cloud", 11.0},
		{"rejected_device", 13.0},
		{"rejected_cloud", 14.0},
		{"rejected_per_token_device", 13.0 / 12},
		{"rejected_per_token_cloud", 14.0 / 12},
		{"bytes_up_per_token", 1000.0 / 12},
		{"bytes_down_per_token", 2000.0 / 12},
		{"low_prob_drafts_device", []any{1.0, 2.0, 3.0}},
		{"low_prob_drafts_cloud", []any{4.0, 5.0, 6.0}},
		{"low_prob_caught_device", []any{0.0, 1.0, 2.0}},
		{"low_prob_caught_cloud", []any{1.0, 1.0, 3.0}},
		{"fallback", true},
		{"fallback_step", 7.0},
		{"fallback_reason", "cloud gone"},
		{"passages_restored_device", 2.0},
		{"passages_restored_cloud", 1.0},
		{"hedges_device", 5.0},
		{"hedges_cloud", 8.0},
		{"hedge_hits_device", 1.0},
		{"hedge_hits_cloud", 3.0},
		{"sources_partial", true},
		{"sources", []any{testSourceJSON}},
	} {
		assert.Equal(t, c.want, got[c.key], c.key)
		delete(got, c.key)
	}
	assert.Empty(t, slices.Sorted(maps.Keys(got)), "keys the test does not check")

	// The OpenAI API has the same summary as its "dragon" object, with the
	// sources beside it.
	want := asMap(t, summaryJSON(sum))
	delete(want, "text")
	delete(want, "sources")
	assert.Equal(t, want, asMap(t, device.NewSummaryJSON(sum)), "the OpenAI \"dragon\" object")
}

// testSource is an entry of every field.
func testSource() *dragonv1.Source {
	return &dragonv1.Source{
		Side: dragonv1.Side_SIDE_DEVICE, DocumentId: "00aa", PassageId: 42, Source: "/mail/inbox.mbox#3", Title: "Razor Agents 2.14 Released",
		Metadata: map[string]string{"from": "Ann", "date": "Fri, 26 Jul 2002"}, Start: 10, End: 90, Score: 1.5, Weight: 0.25,
		Share: 0.75, LogLikelihood: -12.5, HasEvidence: true, Excerpt: "Razor Agents 2.14 Released", ClosedBook: true,
	}
}

// testSourceJSON is testSource as every surface shows it.
var testSourceJSON = map[string]any{
	"side": "device", "document_id": "00aa", "passage_id": 42.0, "source": "/mail/inbox.mbox#3", "title": "Razor Agents 2.14 Released",
	"metadata": map[string]any{"from": "Ann", "date": "Fri, 26 Jul 2002"}, "start": 10.0, "end": 90.0, "score": 1.5, "weight": 0.25,
	"share": 0.75, "log_likelihood": -12.5, "excerpt": "Razor Agents 2.14 Released", "closed_book": true,
}

// TestSourceFields: every field of a Source has its key in the JSON form,
// and an entry without evidence has no log-likelihood there.
func TestSourceFields(t *testing.T) {
	fields := (&dragonv1.Source{}).ProtoReflect().Descriptor().Fields()
	e := testSource()
	for i := range fields.Len() {
		require.True(t, e.ProtoReflect().Has(fields.Get(i)), "testSource leaves %s unset", fields.Get(i).Name())
	}
	got := asMap(t, device.NewSourcesJSON(&dragonv1.GenerateSummary{Sources: []*dragonv1.Source{e}})[0])
	assert.Equal(t, testSourceJSON, got)
	e.HasEvidence = false
	got = asMap(t, device.NewSourcesJSON(&dragonv1.GenerateSummary{Sources: []*dragonv1.Source{e}})[0])
	assert.NotContains(t, got, "log_likelihood")
	assert.Equal(t, []device.SourceJSON{}, device.NewSourcesJSON(&dragonv1.GenerateSummary{}), "an empty list, not null")
}

// TestSourcesList: dragon ask's numbered list, largest share first as the
// device sorted them, with where each is and the start of its text.
func TestSourcesList(t *testing.T) {
	list := []device.SourceJSON{
		{Side: "device", Source: "/mail/a.eml", Title: "Razor Agents 2.14 Released", Share: 0.912, Metadata: map[string]string{"from": "Ann", "date": "Fri"}, Excerpt: "Razor Agents 2.14 Released"},
		{Side: "cloud", Source: "sotu/2001.txt", Title: "2001.txt", Share: 0.0881},
		{Side: "device", Title: "the model's own knowledge (closed book)", ClosedBook: true},
	}
	want := "\nSources (share of the answer):\n" +
		" 1. [device 91.2%] Razor Agents 2.14 Released — /mail/a.eml (from Ann, date Fri)\n" +
		"    “Razor Agents 2.14 Released”\n" +
		" 2. [cloud  8.8%] 2001.txt — sotu/2001.txt\n" +
		" 3. [device  0.0%] the model's own knowledge (closed book)\n"
	assert.Equal(t, want, sourcesList(list, false))
	assert.Contains(t, sourcesList(list, true), "the cloud's passages are missing")
	assert.Empty(t, sourcesList(nil, false))
}

// TestSummaryLine: the human-readable summary tells a fallback and
// restored passages only when there are some.
func TestSummaryLine(t *testing.T) {
	const head = "[dragon: 12 tokens (stop), ttft 120 ms, 15.5 ms/token (64.5 tok/s); acceptance device 0.75 cloud 0.50; " +
		"3 aggregator switches (steps decided: device 5, cloud 6); 4 stale drafts; 1000 bytes sent, 2000 received"
	for _, c := range []struct {
		name                          string
		fallback                      bool
		step                          uint32
		reason                        string
		restoredDevice, restoredCloud uint32
		want                          string
	}{
		{name: "plain", want: head + "]"},
		{name: "fallback", fallback: true, step: 7, reason: "cloud gone", want: head + ", answered alone from step 7: cloud gone]"},
		{name: "restored on the cloud", restoredCloud: 2, want: head + "; restored passages device 0 cloud 2]"},
		{name: "both", fallback: true, reason: "unreachable", restoredDevice: 1,
			want: head + ", answered alone from step 0: unreachable; restored passages device 1 cloud 0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &dragonv1.GenerateSummary{
				FinishReason: dragonv1.FinishReason_FINISH_REASON_STOP, Tokens: 12, Mode: dragonv1.Mode_MODE_SPECULATIVE_AGGREGATION,
				Ttft: durationpb.New(120 * time.Millisecond), TokenLatencyMean: durationpb.New(15500 * time.Microsecond),
				TokensPerSecond: 64.5, AcceptanceRateDevice: 0.75, AcceptanceRateCloud: 0.5, AggregatorSwitches: 3,
				StepsAggregatedDevice: 5, StepsAggregatedCloud: 6, StaleDrafts: 4, BytesSent: 1000, BytesReceived: 2000,
				Fallback: c.fallback, FallbackStep: c.step, FallbackReason: c.reason,
				PassagesRestoredDevice: c.restoredDevice, PassagesRestoredCloud: c.restoredCloud,
			}
			assert.Equal(t, c.want, summaryLine(summaryJSON(s).SummaryJSON))
		})
	}
}

func TestFilterFlag(t *testing.T) {
	f, err := filterFlag("filter", map[string]string{"source": "mail/", "from": "ann", "after": "2002-01-01", "before": "2002-06-01T12:00:00Z"})
	require.NoError(t, err)
	assert.Equal(t, "mail/", f.GetSourcePrefix())
	assert.Equal(t, "ann", f.GetFrom())
	assert.Equal(t, "2002-01-01T00:00:00Z", f.GetAfter().AsTime().Format(time.RFC3339))
	assert.Equal(t, "2002-06-01T12:00:00Z", f.GetBefore().AsTime().Format(time.RFC3339))
	f, err = filterFlag("filter", nil)
	require.NoError(t, err)
	assert.Nil(t, f)
	_, err = filterFlag("cloud-filter", map[string]string{"subject": "x"})
	assert.ErrorContains(t, err, `--cloud-filter: unknown key "subject"`)
	_, err = filterFlag("filter", map[string]string{"after": "yesterday"})
	assert.ErrorContains(t, err, "want a day")
}
