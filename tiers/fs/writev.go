package fs

import (
	"os"

	"golang.org/x/sys/unix"
)

// writeAtv writes bufs back to back at off: one pwritev on an *os.File
// (the record's header and its block in one system call, as one write of
// the two would cost a copy of the block), one WriteAt per buffer on any
// other File (a Faulty one sees each). A short write is resumed where it
// stopped.
func writeAtv(f File, bufs [][]byte, off int64) error {
	osf, ok := f.(*os.File)
	if !ok {
		for _, b := range bufs {
			if _, err := f.WriteAt(b, off); err != nil {
				return err
			}
			off += int64(len(b))
		}
		return nil
	}
	// NB: the raw descriptor, not SyscallConn's Write: that takes the
	// file's write lock, and four workers writing one segment then queue in
	// Go (a goroutine park and wake per hand-off) where the kernel would
	// let them spin briefly on the inode's lock: 0.52× against 0.76× of raw
	// (docs/PERFORMANCE.md). The caller holds f open (fileCache) for the
	// call.
	fd := int(osf.Fd())
	for len(bufs) > 0 {
		n, err := unix.Pwritev(fd, bufs, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return &os.PathError{Op: "pwritev", Path: osf.Name(), Err: err}
		}
		off += int64(n)
		bufs = advance(bufs, n)
	}
	return nil
}

// advance drops the first n bytes of bufs.
func advance(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 && n > 0 {
		bufs = append([][]byte{bufs[0][n:]}, bufs[1:]...)
	}
	return bufs
}
