package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	dragonv1 "github.com/dragon-rag/dragon/proto/dragon/v1"
	"github.com/dragon-rag/dragon/wire"
)

func init() { commands = append(commands, newDocsCmd) }

// docsClient is what every docs subcommand shares: the device's address
// and connection settings, and --json.
type docsClient struct {
	device string
	grpc   wire.Config
	asJSON bool
}

func (c *docsClient) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&c.device, "device", defaultDeviceAddr, "the device daemon's address")
	f.BoolVar(&c.asJSON, "json", false, "print the result as JSON")
	c.grpc.RegisterFlags(f, "device-")
}

// with dials the device and runs f with a client of its document API.
func (c *docsClient) with(f func(dragonv1.DocumentServiceClient) error) error {
	client, done, err := c.dial()
	if err != nil {
		return err
	}
	defer done()
	return f(client)
}

func (c *docsClient) dial() (dragonv1.DocumentServiceClient, func(), error) {
	if c.grpc.Token == "" {
		c.grpc.Token = os.Getenv("DRAGON_TOKEN")
	}
	autoInsecure(&c.grpc, c.device)
	opts, err := c.grpc.DialOptions()
	if err != nil {
		return nil, nil, err
	}
	conn, err := grpc.NewClient(c.device, opts...)
	if err != nil {
		return nil, nil, err
	}
	return dragonv1.NewDocumentServiceClient(conn), func() { conn.Close() }, nil
}

func newDocsCmd() *cobra.Command {
	var c docsClient
	cmd := &cobra.Command{
		Use:   "docs",
		Short: "Add, list and remove the documents of a running device daemon",
		Long: `A client of the device daemon's document API (dragon.v1.DocumentService;
the same API is on its --http port as /v1/documents). Documents added are
durable and searchable once the command prints them; their dense vectors
follow in the background ("embedding" in dragon docs ls). Nothing of them
ever reaches the cloud.`,
	}
	c.register(cmd)
	cmd.AddCommand(newDocsAddCmd(&c), newDocsLsCmd(&c), newDocsRmCmd(&c), newDocsStatsCmd(&c))
	return cmd
}

// uploadChunk is the bytes of a file per stream message.
const uploadChunk = 256 << 10

func newDocsAddCmd(c *docsClient) *cobra.Command {
	var (
		inPlace bool
		meta    map[string]string
	)
	cmd := &cobra.Command{
		Use:   "add [--in-place] FILE|FOLDER...",
		Short: "Upload files (a folder's files, named by their path under its parent) to the device",
		Long: `Uploads each FILE, and each file under each FOLDER (hidden ones skipped), to
the device daemon, named by its path relative to the folder's parent
("notes/trip.md"). Adding a file again under the same name replaces it; the
same bytes again do nothing. With --in-place the paths are sent instead, to
be read on the device's own machine where they are.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			client, done, err := c.dial()
			if err != nil {
				return err
			}
			defer done()
			stream, err := client.AddDocuments(cmd.Context())
			if err != nil {
				return err
			}
			sent := 0
			for _, arg := range args {
				if inPlace {
					abs, err := filepath.Abs(arg)
					if err != nil {
						return err
					}
					if err := stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_Path{Path: abs}}); err != nil {
						return sendErr(stream, err)
					}
					continue
				}
				files, err := uploadNames(arg)
				if err != nil {
					return err
				}
				for _, f := range files {
					if err := uploadFile(stream, f.path, f.name, meta); err != nil {
						return err
					}
					sent++
					if !c.asJSON {
						fmt.Fprintf(cmd.ErrOrStderr(), "sent %s\n", f.name)
					}
				}
			}
			resp, err := stream.CloseAndRecv()
			if err != nil {
				return err
			}
			var failed int
			if c.asJSON {
				if err := printProtoJSON(cmd.OutOrStdout(), resp); err != nil {
					return err
				}
				for _, d := range resp.GetDocuments() {
					if d.GetStatus() == dragonv1.DocumentStatus_DOCUMENT_STATUS_FAILED {
						failed++
					}
				}
			} else {
				failed = printDocs(cmd.OutOrStdout(), resp.GetDocuments())
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d files could not be added", failed, len(resp.GetDocuments()))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&inPlace, "in-place", false, "send the paths, for the device to read on its own machine")
	cmd.Flags().StringToStringVar(&meta, "meta", nil, "metadata for every file, key=value (repeatable)")
	return cmd
}

// sendErr is the stream's own error when Send fails (Send gives only
// io.EOF then).
func sendErr(stream dragonv1.DocumentService_AddDocumentsClient, err error) error {
	if errors.Is(err, io.EOF) {
		_, err = stream.CloseAndRecv()
	}
	return err
}

type upload struct{ path, name string }

// uploadNames lists a file, or the files under a folder, with the names
// they are uploaded under.
func uploadNames(arg string) ([]upload, error) {
	info, err := os.Stat(arg)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []upload{{arg, filepath.Base(arg)}}, nil
	}
	root := filepath.Dir(filepath.Clean(arg))
	var out []upload
	err = filepath.WalkDir(arg, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != arg && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			out = append(out, upload{p, filepath.ToSlash(rel)})
		}
		return nil
	})
	return out, err
}

func uploadFile(stream dragonv1.DocumentService_AddDocumentsClient, path, name string, meta map[string]string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return err
	}
	hdr := &dragonv1.FileHeader{Name: name, Metadata: meta, Size: uint64(info.Size())}
	if err := stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_File{File: hdr}}); err != nil {
		return sendErr(stream, err)
	}
	buf := make([]byte, uploadChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if serr := stream.Send(&dragonv1.AddDocumentsRequest{Part: &dragonv1.AddDocumentsRequest_Data{Data: buf[:n]}}); serr != nil {
				return sendErr(stream, serr)
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", path, err)
		}
	}
}

func newDocsLsCmd(c *docsClient) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "List the device's documents with their status",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(client dragonv1.DocumentServiceClient) error {
				var all []*dragonv1.Document
				token := ""
				for {
					resp, err := client.ListDocuments(cmd.Context(), &dragonv1.ListDocumentsRequest{PageSize: 1000, PageToken: token})
					if err != nil {
						return err
					}
					all = append(all, resp.GetDocuments()...)
					if token = resp.GetNextPageToken(); token == "" {
						break
					}
				}
				if c.asJSON {
					return printProtoJSON(cmd.OutOrStdout(), &dragonv1.ListDocumentsResponse{Documents: all, Total: uint32(len(all))})
				}
				printDocs(cmd.OutOrStdout(), all)
				return nil
			})
		},
	}
}

var docIDPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

func newDocsRmCmd(c *docsClient) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID|SOURCE...",
		Short: "Remove documents by id (as dragon docs ls shows it) or by source",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return c.with(func(client dragonv1.DocumentServiceClient) error {
				type removed struct {
					Document string `json:"document"`
					Passages uint32 `json:"passages_removed"`
				}
				var out []removed
				for _, a := range args {
					req := &dragonv1.DeleteDocumentRequest{Document: &dragonv1.DeleteDocumentRequest_Source{Source: a}}
					if docIDPattern.MatchString(a) {
						req.Document = &dragonv1.DeleteDocumentRequest_Id{Id: a}
					}
					resp, err := client.DeleteDocument(cmd.Context(), req)
					if err != nil {
						return fmt.Errorf("remove %s: %w", a, err)
					}
					out = append(out, removed{a, resp.GetPassagesRemoved()})
					if !c.asJSON {
						fmt.Fprintf(cmd.OutOrStdout(), "removed %s (%d passages)\n", a, resp.GetPassagesRemoved())
					}
				}
				if c.asJSON {
					enc := json.NewEncoder(cmd.OutOrStdout())
					enc.SetIndent("", "  ")
					return enc.Encode(out)
				}
				return nil
			})
		},
	}
}

func newDocsStatsCmd(c *docsClient) *cobra.Command {
	return &cobra.Command{
		Use:   "stats",
		Short: "Count the device's documents, passages and vectors still to compute",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.with(func(client dragonv1.DocumentServiceClient) error {
				s, err := client.DocumentStats(cmd.Context(), &dragonv1.DocumentStatsRequest{})
				if err != nil {
					return err
				}
				if c.asJSON {
					return printProtoJSON(cmd.OutOrStdout(), s)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d documents (%d failed), %d passages, %d waiting for vectors, %.1f MiB on disk\n",
					s.GetDocuments(), s.GetFailed(), s.GetPassages(), s.GetPendingVectors(), float64(s.GetDiskBytes())/(1<<20))
				return nil
			})
		},
	}
}

func printProtoJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// printDocs prints a table of documents and returns how many failed.
func printDocs(w io.Writer, docs []*dragonv1.Document) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tPASSAGES\tSOURCE\tTITLE / ERROR")
	failed := 0
	for _, d := range docs {
		st := strings.ToLower(strings.TrimPrefix(d.GetStatus().String(), "DOCUMENT_STATUS_"))
		note := d.GetTitle()
		switch {
		case d.GetStatus() == dragonv1.DocumentStatus_DOCUMENT_STATUS_FAILED:
			failed++
			note = d.GetError()
		case d.GetStatus() == dragonv1.DocumentStatus_DOCUMENT_STATUS_EMBEDDING:
			st = fmt.Sprintf("embedding %d/%d", d.GetEmbedded(), d.GetPassages())
		case d.GetUnchanged():
			st += " (unchanged)"
		}
		id := d.GetId()
		if id == "" {
			id = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", id, st, d.GetPassages(), d.GetSource(), note)
	}
	tw.Flush()
	return failed
}
