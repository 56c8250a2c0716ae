package weaviate

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Object is one passage as stored.
type Object struct {
	// PID is the passage id; the object id is ObjectID(PID).
	PID    uint64
	Source string
	// Start and End are byte offsets into the source document's text.
	Start, End int
	Tokens     int
	Text       string
	Meta       map[string]string
	// Terms are the passage's analyzed terms, in order.
	Terms []string
	// Vector is the passage's embedding (nil in a BM25-only collection).
	Vector []float32
}

// ObjectError is one object a batch could not store.
type ObjectError struct {
	PID uint64
	Err string
}

func (e ObjectError) Error() string { return fmt.Sprintf("passage %x: %s", e.PID, e.Err) }

type wireObject struct {
	Class      string         `json:"class"`
	ID         string         `json:"id"`
	Properties map[string]any `json:"properties"`
	Vector     []float32      `json:"vector,omitempty"`
}

// Upsert writes objects (replacing any with the same passage id) with
// consistency QUORUM, so a write acknowledged by a cluster with replicas
// survives losing a node. Objects the engine refuses come back one by one;
// the rest are stored. The error is for the batch as a whole. The term
// statistics are invalidated first.
func (c *Client) Upsert(ctx context.Context, objs []Object) ([]ObjectError, error) {
	if len(objs) == 0 {
		return nil, nil
	}
	wire := make([]wireObject, len(objs))
	byID := make(map[string]uint64, len(objs))
	for i, o := range objs {
		meta := ""
		if len(o.Meta) > 0 {
			b, err := json.Marshal(o.Meta)
			if err != nil {
				return nil, err
			}
			meta = string(b)
		}
		wire[i] = wireObject{
			Class: c.cfg.Collection, ID: ObjectID(o.PID), Vector: o.Vector,
			Properties: map[string]any{
				"pid": strconv.FormatUint(o.PID, 16), "source": o.Source, "start": o.Start, "end": o.End,
				"tokens": o.Tokens, "text": o.Text, "meta": meta,
				"terms": strings.Join(o.Terms, " "), "nterms": len(o.Terms),
			},
		}
		byID[wire[i].ID] = o.PID
	}
	if err := c.InvalidateTermStats(ctx); err != nil {
		return nil, err
	}
	refused, err := c.batch(ctx, wire)
	var failed []ObjectError
	for id, msgs := range refused {
		failed = append(failed, ObjectError{PID: byID[id], Err: strings.Join(msgs, "; ")})
	}
	slices.SortFunc(failed, func(a, b ObjectError) int { return cmp.Compare(a.PID, b.PID) })
	return failed, err
}

// batch writes objects with consistency QUORUM, so a write acknowledged
// by a cluster with replicas survives losing a node, and returns the
// engine's messages for each object it refused, by object id.
func (c *Client) batch(ctx context.Context, objs []wireObject) (map[string][]string, error) {
	var resp []struct {
		ID     string `json:"id"`
		Result struct {
			Errors *struct {
				Error []struct {
					Message string `json:"message"`
				} `json:"error"`
			} `json:"errors"`
		} `json:"result"`
	}
	body := struct {
		Objects []wireObject `json:"objects"`
	}{objs}
	if err := c.do(ctx, http.MethodPost, "/v1/batch/objects?consistency_level=QUORUM", body, &resp); err != nil {
		return nil, err
	}
	refused := map[string][]string{}
	for _, r := range resp {
		if r.Result.Errors == nil || len(r.Result.Errors.Error) == 0 {
			continue
		}
		for _, e := range r.Result.Errors.Error {
			refused[r.ID] = append(refused[r.ID], e.Message)
		}
	}
	if len(resp) != len(objs) {
		return refused, fmt.Errorf("%w: batch of %d objects answered for %d", ErrInvalid, len(objs), len(resp))
	}
	return refused, nil
}

// Existing returns which of the passage ids are stored.
func (c *Client) Existing(ctx context.Context, pids []uint64) (map[uint64]bool, error) {
	objs, err := c.byPIDs(ctx, pids, "pid")
	if err != nil {
		return nil, err
	}
	out := make(map[uint64]bool, len(objs))
	for p := range objs {
		out[p] = true
	}
	return out, nil
}

// Count is how many passages the collection holds.
func (c *Client) Count(ctx context.Context) (int, error) {
	q := fmt.Sprintf(`{ Aggregate { %s { meta { count } } } }`, c.cfg.Collection)
	var data struct {
		Aggregate map[string][]struct {
			Meta struct {
				Count int `json:"count"`
			} `json:"meta"`
		}
	}
	if err := c.graphQL(ctx, q, &data); err != nil {
		return 0, err
	}
	rows := data.Aggregate[c.cfg.Collection]
	if len(rows) == 0 {
		return 0, nil
	}
	return rows[0].Meta.Count, nil
}

// DeleteUnder removes the passages of source and of every source under it
// (source#N: an mbox's messages; source/...: a folder's files).
func (c *Client) DeleteUnder(ctx context.Context, source string) (int, error) {
	if strings.ContainsAny(source, "*?") {
		return 0, fmt.Errorf("%w: source %q holds a wildcard", ErrInvalid, source)
	}
	n := 0
	for _, w := range []map[string]any{
		{"path": []string{"source"}, "operator": "Equal", "valueText": source},
		{"path": []string{"source"}, "operator": "Like", "valueText": source + "#*"},
		{"path": []string{"source"}, "operator": "Like", "valueText": source + "/*"},
	} {
		k, err := c.deleteWhere(ctx, w)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// DeleteStale removes the passages of file whose ids are not in keep:
// what an earlier version of the file left behind once its current
// passages are keep. With messages (a mailbox) that includes the passages
// of its messages, sources file#N.
func (c *Client) DeleteStale(ctx context.Context, file string, messages bool, keep []uint64) (int, error) {
	of := []map[string]any{{"path": []string{"source"}, "operator": "Equal", "valueText": file}}
	if messages {
		if strings.ContainsAny(file, "*?") {
			return 0, fmt.Errorf("%w: mailbox %q holds a wildcard", ErrInvalid, file)
		}
		of = append(of, map[string]any{"path": []string{"source"}, "operator": "Like", "valueText": file + "#*"})
	}
	where := map[string]any{"operator": "Or", "operands": of}
	if len(keep) > 0 {
		where = map[string]any{"operator": "And", "operands": []map[string]any{
			where,
			{"path": []string{"pid"}, "operator": "ContainsNone", "valueTextArray": pidTexts(keep)},
		}}
	}
	return c.deleteWhere(ctx, where)
}

// DeleteSources removes the passages of the given sources, named whole
// (no wildcards: any name is taken as it is), whose ids are not in keep.
func (c *Client) DeleteSources(ctx context.Context, sources []string, keep []uint64) (int, error) {
	n := 0
	// A filter's list stays a few hundred names long.
	const per = 256
	for i := 0; i < len(sources); i += per {
		where := map[string]any{"path": []string{"source"}, "operator": "ContainsAny", "valueTextArray": sources[i:min(i+per, len(sources))]}
		if len(keep) > 0 {
			where = map[string]any{"operator": "And", "operands": []map[string]any{
				where,
				{"path": []string{"pid"}, "operator": "ContainsNone", "valueTextArray": pidTexts(keep)},
			}}
		}
		k, err := c.deleteWhere(ctx, where)
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *Client) deleteWhere(ctx context.Context, where map[string]any) (int, error) {
	body := map[string]any{
		"match": map[string]any{"class": c.cfg.Collection, "where": where},
	}
	var resp struct {
		Results struct {
			Successful int `json:"successful"`
			Failed     int `json:"failed"`
		} `json:"results"`
	}
	if err := c.do(ctx, http.MethodDelete, "/v1/batch/objects?consistency_level=QUORUM", body, &resp); err != nil {
		return 0, err
	}
	if resp.Results.Successful > 0 {
		if err := c.InvalidateTermStats(ctx); err != nil {
			return resp.Results.Successful, err
		}
	}
	if resp.Results.Failed > 0 {
		return resp.Results.Successful, fmt.Errorf("weaviate: %d passages not deleted", resp.Results.Failed)
	}
	return resp.Results.Successful, nil
}
