package fs

import (
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// countingFS opens real files and counts opens and closes.
type countingFS struct {
	OS
	opens, closes atomic.Int64
}

type countedFile struct {
	File
	fs     *countingFS
	closed atomic.Bool
}

func (c *countedFile) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		panic("closed twice")
	}
	c.fs.closes.Add(1)
	return c.File.Close()
}

func (c *countingFS) Open(name string) (File, error)      { return c.count(c.OS.Open(name)) }
func (c *countingFS) OpenWrite(name string) (File, error) { return c.count(c.OS.OpenWrite(name)) }
func (c *countingFS) count(f File, err error) (File, error) {
	if err != nil {
		return nil, err
	}
	c.opens.Add(1)
	return &countedFile{File: f, fs: c}, nil
}

func TestFileCacheKeepsFilesOpenAndClosesEachOnce(t *testing.T) {
	dir := t.TempDir()
	paths := make([]string, 4)
	for i := range paths {
		paths[i] = filepath.Join(dir, string(rune('a'+i)))
		require.NoError(t, os.WriteFile(paths[i], []byte("x"), 0o644))
	}
	fsys := &countingFS{}
	c := newFileCache(fsys, 2)

	_, rel, err := c.acquire(paths[0], false)
	require.NoError(t, err)
	rel()
	_, rel, err = c.acquire(paths[0], false)
	require.NoError(t, err)
	rel()
	require.EqualValues(t, 1, fsys.opens.Load(), "the second read reuses the open file")
	_, rel, err = c.acquire(paths[0], true)
	require.NoError(t, err)
	rel()
	require.EqualValues(t, 2, fsys.opens.Load(), "a write never gets the read-only file")

	// Held while dropped: closed when let go, not before.
	f, rel, err := c.acquire(paths[1], false)
	require.NoError(t, err)
	c.drop(paths[1])
	closes := fsys.closes.Load()
	var b [1]byte
	_, err = f.ReadAt(b[:], 0)
	require.NoError(t, err, "a file dropped while held still reads")
	rel()
	require.Equal(t, closes+1, fsys.closes.Load())

	// Past the bound the least recently used goes.
	for _, p := range paths[2:] {
		_, rel, err := c.acquire(p, false)
		require.NoError(t, err)
		rel()
	}
	c.mu.Lock()
	require.Len(t, c.files, 2)
	c.mu.Unlock()

	_, err = os.Stat(filepath.Join(dir, "missing"))
	require.Error(t, err)
	_, _, err = c.acquire(filepath.Join(dir, "missing"), false)
	require.ErrorIs(t, err, os.ErrNotExist)

	c.closeAll()
	require.Equal(t, fsys.opens.Load(), fsys.closes.Load(), "every file opened is closed")
}

// Workers racing on one path share one open file; every open is closed
// once the cache is emptied.
func TestFileCacheUnderConcurrentWorkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))
	fsys := &countingFS{}
	c := newFileCache(fsys, 1)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				f, rel, err := c.acquire(path, (w+i)%2 == 0)
				if err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					c.drop(path)
				}
				if _, err := f.ReadAt(make([]byte, 1), 0); err != nil && (w+i)%2 == 1 {
					t.Error(err)
				}
				rel()
			}
		}()
	}
	wg.Wait()
	c.closeAll()
	require.Equal(t, fsys.opens.Load(), fsys.closes.Load())
}

// An open that raced a removal of its path (the file opened, then dropped
// and deleted before it was cached) serves its operation and is not
// cached: no deleted segment stays open.
func TestFileCacheDoesNotKeepAFileDroppedWhileOpening(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg")
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o644))
	fsys := &dropWhileOpening{}
	c := newFileCache(fsys, 4)
	fsys.during = func() { c.drop(path) }
	f, rel, err := c.acquire(path, false)
	require.NoError(t, err)
	_, err = f.ReadAt(make([]byte, 1), 0)
	require.NoError(t, err, "the operation that opened it is served")
	rel()
	c.mu.Lock()
	require.Empty(t, c.files, "nothing cached")
	c.mu.Unlock()
	require.Equal(t, fsys.opens.Load(), fsys.closes.Load(), "closed once let go")
}

// dropWhileOpening runs during inside each Open, after the file opened.
type dropWhileOpening struct {
	countingFS
	during func()
}

func (d *dropWhileOpening) Open(name string) (File, error) {
	f, err := d.countingFS.Open(name)
	d.during()
	return f, err
}
