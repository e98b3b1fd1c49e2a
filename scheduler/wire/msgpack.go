package wire

import "github.com/kvtier/kvtier/internal/msgp"

// The codec's msgpack reader and writer are internal/msgp's, the one strict
// core under every wire package.
type (
	reader = msgp.Reader
	writer = msgp.Writer
)

// errShort: the frame ends inside a value.
var errShort = msgp.ErrShort
