package events

import (
	"errors"

	"github.com/kvtier/kvtier/messages"
)

var (
	// ErrMalformed: a payload or frame that does not follow the wire format.
	ErrMalformed = errors.New("events: malformed payload")
	// ErrBadConfig is messages.ErrBadConfig: an invalid events setting.
	ErrBadConfig = messages.ErrBadConfig
	// ErrClosed: the publisher is closed.
	ErrClosed = errors.New("events: publisher closed")
)
