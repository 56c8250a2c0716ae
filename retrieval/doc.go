// Package retrieval turns files into passages and finds the passages most
// relevant to a query, for one side (device or cloud) of a DRAGON pair.
//
// It ingests plain text, Markdown, RFC 822 mail and mbox files, splits them
// into passages of a fixed number of model tokens (so that a passage fills a
// known share of a KV sequence), and indexes them twice: BM25 through bleve
// and dense embeddings, scanned exactly up to Options.ExactDenseMax
// passages and searched through an HNSW graph past it. Search returns hits
// with a relevance score R(d, q) calibrated so that softmax(R) over the top
// k is the document weight ω(d) of DRAGON's output aggregation (§2.2), and
// logsumexp(R) is the side's h̃ (Appendix A.1).
//
// An index lives in one directory: manifest.json, passages.jsonl,
// files.json, the bleve index in bleve/ and the vectors: in dense.vec, or,
// while the index is past ExactDenseMax, in its HNSW graph, dense.hnsw.
// The graph is built from the vectors when first needed (an open that
// needs one the index lacks builds it in memory). Indexes of format 1
// kept a graph at any size; they open as they are, and a write drops the
// graph if the index does not need it. Many goroutines may search an open
// Index while one adds or deletes.
package retrieval
