package receiver

import (
	"bytes"
	"io"
)

// indent returns a writer that starts every line written to it with the 7 spaces that set
// builder and deployer output apart from kpush's "----->" phase headers (the Heroku layout).
// Bytes pass through at once; nothing waits for a newline.
func indent(w io.Writer) io.Writer { return &indenter{w: w, bol: true} }

type indenter struct {
	w   io.Writer
	bol bool // at the beginning of a line
}

var pad = []byte("       ")

func (in *indenter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if in.bol {
			if _, err := in.w.Write(pad); err != nil {
				return n, err
			}
			in.bol = false
		}
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i+1]
			in.bol = true
		}
		m, err := in.w.Write(chunk)
		n += m
		if err != nil {
			return n, err
		}
		p = p[len(chunk):]
	}
	return n, nil
}
