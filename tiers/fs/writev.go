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
	rc, err := osf.SyscallConn()
	if err != nil {
		return err
	}
	for len(bufs) > 0 {
		var n int
		var werr error
		if err := rc.Write(func(fd uintptr) bool {
			n, werr = unix.Pwritev(int(fd), bufs, off)
			return werr != unix.EAGAIN
		}); err != nil {
			return err
		}
		if werr == unix.EINTR {
			continue
		}
		if werr != nil {
			return &os.PathError{Op: "pwritev", Path: osf.Name(), Err: werr}
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
