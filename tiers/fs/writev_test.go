package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAdvanceDropsWrittenBytes(t *testing.T) {
	bufs := [][]byte{[]byte("abc"), []byte("defg"), []byte("h")}
	for n, want := range map[int]string{0: "abcdefgh", 2: "cdefgh", 3: "defgh", 5: "fgh", 7: "h", 8: ""} {
		require.Equal(t, want, string(bytes.Join(advance(bufs, n), nil)), "after %d bytes", n)
	}
	require.Equal(t, "abc", string(bufs[0]), "the caller's slices are not changed")
}

// writeAtv puts the buffers back to back at the offset, through pwritev on
// an *os.File and through one WriteAt each on any other File, leaving the
// bytes around them as they were.
func TestWriteAtvWritesBuffersBackToBack(t *testing.T) {
	bufs := [][]byte{[]byte("head"), bytes.Repeat([]byte{7}, 300<<10), []byte("tail")}
	want := append(append([]byte("XX"), bytes.Join(bufs, nil)...), "YY"...)
	for name, wrap := range map[string]func(*os.File) File{
		"os.File":      func(f *os.File) File { return f },
		"another File": func(f *os.File) File { return struct{ File }{f} },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "seg")
			require.NoError(t, os.WriteFile(path, append([]byte("XX"), make([]byte, len(want)-2)...), 0o644))
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			require.NoError(t, err)
			require.NoError(t, writeAtv(wrap(f), bufs, 2))
			_, err = f.WriteAt([]byte("YY"), int64(len(want)-2))
			require.NoError(t, err)
			require.NoError(t, f.Close())
			got, err := os.ReadFile(path)
			require.NoError(t, err)
			require.True(t, bytes.Equal(want, got))
		})
	}
}
