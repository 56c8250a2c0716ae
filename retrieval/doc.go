// Package retrieval turns files into passages and finds the passages most
// relevant to a query, for one side (device or cloud) of a DRAGON pair.
//
// It ingests plain text, Markdown, RFC 822 mail and mbox files (with their
// attachments), and PDF, HTML and DOCX through package extract, splits
// them into passages of a fixed number of model tokens (so that a passage
// fills a known share of a KV sequence), and indexes them twice: BM25 through bleve
// and dense embeddings, scanned exactly up to Options.ExactDenseMax
// passages and past it ranked by one-bit codes kept in memory, the
// nearest of them scored exactly from the vectors on disk (vectorStore). Search returns hits
// with a relevance score R(d, q) calibrated so that softmax(R) over the top
// k is the document weight ω(d) of DRAGON's output aggregation (§2.2), and
// logsumexp(R) is the side's h̃ (Appendix A.1).
//
// An index lives in one directory: manifest.json, a snapshot of the
// generation the manifest names (passages-G.jsonl, files-G.json, and the
// vectors, dense-G.vec), the journal of the changes since
// (journal.log) and the bleve index in bleve/. Every change (an Add's
// commit group, a Put, a Delete) is one journal record, synced before it
// is applied: it is durable once the call returns, all of it or none
// survives a crash, and Open replays what the snapshot lacks. A
// checkpoint writes the next generation and then the manifest, which is
// the commit point. Dense vectors are not journaled: passages whose
// vectors did not reach a checkpoint are pending, searchable by BM25
// until EmbedPending gives them one. Indexes of format 1 kept their
// vectors in an HNSW graph (dense.hnsw) at any size, and those of format 3
// did past the old exact-search size; those of format 2 had fixed file
// names and no journal. All open as they are and are rewritten at the
// first checkpoint. Many goroutines may search
// an open Index while one adds or deletes.
package retrieval
