// Package retrieval turns files into passages and finds the passages most
// relevant to a query, for one side (device or cloud) of a DRAGON pair.
//
// It ingests plain text, Markdown, RFC 822 mail and mbox files, splits them
// into passages of a fixed number of model tokens (so that a passage fills a
// known share of a KV sequence), and indexes them twice: BM25 through bleve
// and dense embeddings in an HNSW graph. Search returns hits with a
// relevance score R(d, q) calibrated so that softmax(R) over the top k is the
// document weight ω(d) of DRAGON's output aggregation (§2.2), and
// logsumexp(R) is the side's h̃ (Appendix A.1).
//
// An index lives in one directory: manifest.json, passages.jsonl,
// files.json, the bleve index in bleve/ and the HNSW graph in dense.hnsw.
// Many goroutines may search an open Index while one adds or deletes.
package retrieval
