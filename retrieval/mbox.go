package retrieval

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxMessage bounds one mbox message, so a file without separators cannot
// exhaust memory.
const maxMessage = 64 << 20

// splitMbox calls fn with each raw message of an mbox stream (without its
// "From " separator line), numbered from 1. Messages are separated by a line
// starting with "From " at the start of the file or after an empty line;
// ">From " quoting (mboxrd) is undone. fn's error stops the scan.
func splitMbox(r io.Reader, fn func(n int, raw []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		msg       bytes.Buffer
		n         int
		inMessage bool
		prevBlank = true
	)
	flush := func() error {
		if !inMessage {
			return nil
		}
		n++
		return fn(n, msg.Bytes())
	}
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			if prevBlank && bytes.HasPrefix(line, []byte("From ")) {
				if ferr := flush(); ferr != nil {
					return ferr
				}
				msg.Reset()
				inMessage = true
				prevBlank = false
				continue
			}
			if !inMessage {
				return errors.New("not an mbox: the first line does not start with \"From \"")
			}
			prevBlank = len(bytes.TrimRight(line, "\r\n")) == 0
			if unq := bytes.TrimLeft(line, ">"); len(unq) < len(line) && bytes.HasPrefix(unq, []byte("From ")) {
				line = line[1:]
			}
			if msg.Len()+len(line) > maxMessage {
				return fmt.Errorf("message %d is larger than %d bytes", n+1, maxMessage)
			}
			msg.Write(line)
		}
		if errors.Is(err, io.EOF) {
			return flush()
		}
		if err != nil {
			return fmt.Errorf("read mbox: %w", err)
		}
	}
}
