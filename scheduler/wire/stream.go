package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

	"github.com/kvtier/kvtier/messages"
)

// Stream framing, for the endpoint's unix:// transport: on a Unix stream
// socket each frame (a request or a reply, exactly as over ZeroMQ) is
// preceded by its length as a 4-byte big-endian unsigned integer, 1 ..
// MaxFrameBytes. A connection is one engine session, as one ZeroMQ
// connection is.

// WriteFrame writes one length-prefixed frame in a single write.
func WriteFrame(w io.Writer, frame []byte) error { return WriteFrames(w, frame) }

// WriteFrames writes length-prefixed frames, in order, in a single write
// (writev): a burst of replies costs the engine one read, not one each.
// Nothing is written if a frame is empty or too long.
func WriteFrames(w io.Writer, frames ...[]byte) error {
	heads := make([]byte, 0, 4*len(frames))
	for _, f := range frames {
		if len(f) == 0 || len(f) > MaxFrameBytes {
			return fmt.Errorf("%w: frame of %d bytes (1..%d)", messages.ErrBadRequest, len(f), MaxFrameBytes)
		}
		heads = binary.BigEndian.AppendUint32(heads, uint32(len(f)))
	}
	b := make(net.Buffers, 0, 2*len(frames))
	for i, f := range frames {
		b = append(b, heads[4*i:4*i+4:4*i+4], f)
	}
	_, err := b.WriteTo(w)
	return err
}

// ReadFrame reads one length-prefixed frame. A length of 0 or above
// MaxFrameBytes is an error wrapping messages.ErrBadRequest (the stream
// cannot be resynchronised: the caller closes it); io.EOF at a frame
// boundary is returned as it is.
func ReadFrame(r io.Reader) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size == 0 || size > MaxFrameBytes {
		return nil, fmt.Errorf("%w: frame length %d (1..%d)", messages.ErrBadRequest, size, MaxFrameBytes)
	}
	frame := make([]byte, size)
	if _, err := io.ReadFull(r, frame); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return frame, nil
}
