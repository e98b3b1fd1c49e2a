package chaos

import (
	"io"
	"net"
	"sync"
	"time"
)

// proxy is a loopback TCP forwarder between peers: the peer scenario puts
// one in front of every control-plane link (per ordered pair of nodes) and
// every node's data-plane listener, so that a fault can cut the live
// connections (peer-cut) or, for a killed node, refuse every connection
// until it is back. It never changes a byte. Safe for concurrent use.
type proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string // host:port forwarded to; "" refuses
	blocked bool
	closed  bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

func newProxy() (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &proxy{ln: ln, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

func (p *proxy) setTarget(t string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = t
}

// cut closes every live connection (both ends see a reset link); new ones
// are accepted. It returns how many were cut.
func (p *proxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		_ = c.Close()
		n++
	}
	return n / 2
}

// block cuts every connection and refuses new ones until unblock.
func (p *proxy) block(b bool) {
	p.mu.Lock()
	p.blocked = b
	p.mu.Unlock()
	if b {
		p.cut()
	}
}

// close stops the proxy and waits for its goroutines.
func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	_ = p.ln.Close()
	p.cut()
	p.wg.Wait()
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		target, refuse := p.target, p.blocked || p.closed || p.target == ""
		p.mu.Unlock()
		if refuse {
			_ = in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", target, time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		if p.blocked || p.closed {
			p.mu.Unlock()
			_ = in.Close()
			_ = out.Close()
			continue
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies src to dst; when either ends, both connections close.
func (p *proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
