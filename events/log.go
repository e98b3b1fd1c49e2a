package events

import (
	"log"

	"github.com/rs/zerolog"
)

// zmqLogger sends zmq4's own log lines to the structured log at warn.
func zmqLogger(l zerolog.Logger) *log.Logger {
	return log.New(zerologWriter{l.With().Str("component", "zmq4").Logger()}, "", 0)
}

type zerologWriter struct{ l zerolog.Logger }

func (w zerologWriter) Write(p []byte) (int, error) {
	msg := string(p)
	for len(msg) > 0 && msg[len(msg)-1] == '\n' {
		msg = msg[:len(msg)-1]
	}
	w.l.Warn().Msg(msg)
	return len(p), nil
}
