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
func WriteFrame(w io.Writer, frame []byte) error {
	if len(frame) == 0 || len(frame) > MaxFrameBytes {
		return fmt.Errorf("%w: frame of %d bytes (1..%d)", messages.ErrBadRequest, len(frame), MaxFrameBytes)
	}
	b := make(net.Buffers, 2)
	b[0] = binary.BigEndian.AppendUint32(make([]byte, 0, 4), uint32(len(frame)))
	b[1] = frame
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
