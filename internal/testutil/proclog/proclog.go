// Package proclog collects what a child process writes (kvtierd's JSON log
// lines) for tests that wait on one of its records: a Log is the process's
// Stdout or Stderr, and WaitJSON blocks until a record with a given message
// has been written.
package proclog

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
)

// Log is an io.Writer that keeps everything written and splits it into
// lines for waiters. Make one with New; it is safe for concurrent use.
type Log struct {
	mu     sync.Mutex
	all    bytes.Buffer  // everything written
	lines  []string      // the complete lines of all
	split  int           // bytes of all that lines covers
	notify chan struct{} // poked (cap 1) when a line arrives
}

// New returns an empty Log.
func New() *Log { return &Log{notify: make(chan struct{}, 1)} }

// Write implements io.Writer.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.all.Write(p)
	added := false
	for {
		rest := l.all.Bytes()[l.split:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		l.lines = append(l.lines, string(rest[:i]))
		l.split += i + 1
		added = true
	}
	l.mu.Unlock()
	if added {
		select {
		case l.notify <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// String is everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

// WaitJSON returns the first complete line that is a JSON record whose
// "message" is msg, waiting for it until ctx ends; the error then carries
// context.Cause(ctx) (a test that watches the process can cancel ctx with
// the reason it exited).
func (l *Log) WaitJSON(ctx context.Context, msg string) (map[string]any, error) {
	for next := 0; ; {
		l.mu.Lock()
		lines := l.lines[next:]
		next = len(l.lines)
		l.mu.Unlock()
		for _, line := range lines {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["message"] == msg {
				return rec, nil
			}
		}
		select {
		case <-l.notify:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for log line %q: %w", msg, context.Cause(ctx))
		}
	}
}
