package fs

import (
	"container/list"
	"sync"
)

// fileCache keeps segment files open between the workers' operations: a
// 256 KiB record read or written otherwise pays an open and a close, two
// system calls and a path lookup, ~10% of its time on a warm cache
// (docs/PERFORMANCE.md). It is shared by the I/O workers (a mutex, held
// only to look up and count); the actor never touches it.
//
// Invariants:
//   - a file is closed exactly once, when it has left the cache (dropped
//     by its path's removal, pushed out by the bound, or closeAll) and no
//     worker holds it: an operation never sees its file closed under it.
//   - at most max files are cached; one held by a worker past that is
//     closed when it is let go.
//   - a file opened while its path was being dropped (its segment
//     removed) is never cached: it serves the one operation that opened it
//     and closes, so no deleted segment stays open in the cache.
//   - a file opened for writing is never handed out for reading, nor the
//     reverse. (A Faulty FS sees each file's first open, not one per
//     operation.)
type fileCache struct {
	fs    FS
	max   int
	mu    sync.Mutex
	files map[fileKey]*cachedFile
	lru   list.List // of *cachedFile, most recently used first
	drops uint64    // drop calls so far: an open that saw one begin is not cached
}

type fileKey struct {
	path  string
	write bool
}

type cachedFile struct {
	key  fileKey
	f    File
	refs int  // workers holding it
	gone bool // left the cache: closed when refs reaches 0
	elem *list.Element
}

// maxCachedFiles bounds the segment files kept open: the active segment,
// and the recently read ones (64 MiB each: 64 of them are 4 GiB of
// blocks; older segments are opened per read, as before).
const maxCachedFiles = 64

func newFileCache(fsys FS, max int) *fileCache {
	return &fileCache{fs: fsys, max: max, files: map[fileKey]*cachedFile{}}
}

// acquire returns path's file open for reading (or, with write, for
// writing at offsets: OpenWrite), and the function that lets it go.
func (c *fileCache) acquire(path string, write bool) (File, func(), error) {
	key := fileKey{path, write}
	c.mu.Lock()
	if cf := c.files[key]; cf != nil {
		cf.refs++
		c.lru.MoveToFront(cf.elem)
		c.mu.Unlock()
		return cf.f, func() { c.release(cf) }, nil
	}
	drops := c.drops
	c.mu.Unlock()
	// NB: opened outside the lock: one worker's slow open never holds up
	// another's cached file.
	open := c.fs.Open
	if write {
		open = c.fs.OpenWrite
	}
	f, err := open(path)
	if err != nil {
		return nil, nil, err
	}
	c.mu.Lock()
	if cf := c.files[key]; cf != nil { // another worker opened it meanwhile
		cf.refs++
		c.lru.MoveToFront(cf.elem)
		c.mu.Unlock()
		_ = f.Close()
		return cf.f, func() { c.release(cf) }, nil
	}
	cf := &cachedFile{key: key, f: f, refs: 1}
	if c.drops != drops {
		// A removal ran while this was opening: the file may be a deleted
		// segment's. Serve this operation, cache nothing.
		cf.gone = true
		c.mu.Unlock()
		return f, func() { c.release(cf) }, nil
	}
	cf.elem = c.lru.PushFront(cf)
	c.files[key] = cf
	closing := c.trimLocked()
	c.mu.Unlock()
	closeFiles(closing)
	return f, func() { c.release(cf) }, nil
}

func (c *fileCache) release(cf *cachedFile) {
	c.mu.Lock()
	cf.refs--
	last := cf.gone && cf.refs == 0
	c.mu.Unlock()
	if last {
		_ = cf.f.Close()
	}
}

// drop takes path's files out of the cache (the file is being removed);
// each closes now, or when the last worker holding it lets it go.
func (c *fileCache) drop(path string) {
	c.mu.Lock()
	c.drops++
	var closing []File
	for _, write := range []bool{false, true} {
		if cf := c.files[fileKey{path, write}]; cf != nil {
			closing = c.leaveLocked(cf, closing)
		}
	}
	c.mu.Unlock()
	closeFiles(closing)
}

// closeAll empties the cache (the tier is closing).
func (c *fileCache) closeAll() {
	c.mu.Lock()
	var closing []File
	for _, cf := range c.files {
		closing = c.leaveLocked(cf, closing)
	}
	c.mu.Unlock()
	closeFiles(closing)
}

// trimLocked pushes the least recently used files out past the bound.
func (c *fileCache) trimLocked() []File {
	var closing []File
	for len(c.files) > c.max {
		closing = c.leaveLocked(c.lru.Back().Value.(*cachedFile), closing)
	}
	return closing
}

// leaveLocked takes cf out of the cache, adding it to closing when no
// worker holds it.
func (c *fileCache) leaveLocked(cf *cachedFile, closing []File) []File {
	delete(c.files, cf.key)
	c.lru.Remove(cf.elem)
	cf.gone = true
	if cf.refs == 0 {
		closing = append(closing, cf.f)
	}
	return closing
}

func closeFiles(files []File) {
	for _, f := range files {
		_ = f.Close()
	}
}
