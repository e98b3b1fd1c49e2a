package tcp

import (
	"net"
	"syscall"
)

// alive reports whether an idle connection can still carry a transfer:
// no FIN, reset or stray byte is waiting on it. A non-blocking MSG_PEEK
// costs one syscall per reuse and needs no goroutine watching idle
// connections. A consumer closes a connection it refused, canceled or
// disconnected; without this check the next Write on it would fail.
func alive(c net.Conn) bool {
	sc, ok := rawConn(c).(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	live := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		// No error means a FIN (0 bytes) or a stray byte: unusable either way.
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		live = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait for readiness
	})
	return err == nil && live
}
