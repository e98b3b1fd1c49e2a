package chaos

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// proxy is a loopback TCP forwarder between peers: the peer scenario puts
// one in front of every control-plane link (per ordered pair of nodes) and
// every node's data-plane listener, so that a fault can cut the live
// connections (peer-cut), make one direction of a connection silently drop
// what it carries (peer-halfopen), or, for a killed node, refuse every
// connection until it is back. It never changes a byte it delivers. Safe
// for concurrent use.
type proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string // host:port forwarded to; "" refuses
	blocked bool
	closed  bool
	conns   map[net.Conn]struct{}
	flows   []*flow // live directions, in the order they were accepted
	wg      sync.WaitGroup
}

// flow is one direction of a proxied connection.
type flow struct {
	dst, src net.Conn
	drop     atomic.Bool // half-open: what src sends is read and dropped
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
		up, down := &flow{dst: out, src: in}, &flow{dst: in, src: out}
		p.flows = append(p.flows, up, down)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(up)
		go p.pipe(down)
	}
}

// halfOpen makes one live direction (the pick-th, modulo how many there
// are) drop everything from now on, the connection left open: neither end
// hears of it until a heartbeat or deadline gives up on it and closes it.
// It reports whether there was a live direction.
func (p *proxy) halfOpen(pick uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.flows) == 0 {
		return false
	}
	p.flows[pick%uint64(len(p.flows))].drop.Store(true)
	return true
}

// pipe copies a flow's source to its destination (or drops it, once the
// flow is half-open); when either end closes, both connections close.
func (p *proxy) pipe(f *flow) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.src.Read(buf)
		if n > 0 && !f.drop.Load() {
			if _, werr := f.dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	_ = f.dst.Close()
	_ = f.src.Close()
	p.mu.Lock()
	delete(p.conns, f.dst)
	delete(p.conns, f.src)
	p.flows = slices.DeleteFunc(p.flows, func(g *flow) bool { return g == f })
	p.mu.Unlock()
}
