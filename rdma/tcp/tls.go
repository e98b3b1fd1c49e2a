package tcp

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"

	"github.com/kvtier/kvtier/rdma"
)

// TLS on the data plane (Config.TLS): the listener wraps every accepted
// connection, the dialer every connection it opens, and each side binds
// the certificate to the node id the protocol names — the dialer by
// verifying the server under the peer's node id, the listener by checking
// the preface's node id against the client certificate.

// serverTLS is the listener's side: client certificates required and
// verified against ClientCAs.
func serverTLS(c *tls.Config) *tls.Config {
	s := c.Clone()
	s.MinVersion = tls.VersionTLS13
	s.ClientAuth = tls.RequireAndVerifyClientCert
	return s
}

// clientTLS is the dialer's side for a write to node: the server must
// present a certificate for that node id, chaining to RootCAs.
func clientTLS(c *tls.Config, node string) *tls.Config {
	s := c.Clone()
	s.MinVersion = tls.VersionTLS13
	s.ServerName = node
	return s
}

// dialTLS runs the client handshake on a fresh connection to node. The
// connection's records go through a recordBatch, which send turns on for
// each payload.
func dialTLS(ctx context.Context, conn net.Conn, c *tls.Config, node string) (net.Conn, error) {
	tc := tls.Client(&recordBatch{Conn: conn}, clientTLS(c, node))
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("tls handshake with %s: %w: %w", node, rdma.ErrPeerGone, err)
	}
	return tc, nil
}

// checkPeerName refuses a TLS connection whose client certificate does not
// name node, the id its preface claims: a peer's certificate lets it write
// only as itself. A plain connection passes.
func checkPeerName(c net.Conn, node string) error {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	certs := tc.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		return fmt.Errorf("tls connection without a client certificate: %w", rdma.ErrProtocol)
	}
	if err := certs[0].VerifyHostname(node); err != nil {
		return fmt.Errorf("preface names %q, its certificate does not: %w", node, rdma.ErrProtocol)
	}
	return nil
}

// rawConn is the TCP connection under c (a TLS one's), for socket-level
// probes.
func rawConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if b, ok := c.(*recordBatch); ok {
		return b.Conn
	}
	return c
}

// tlsBatchBytes is what a recordBatch gathers before it writes: 16 TLS
// records of 16 KiB. crypto/tls writes each record (at most 16 KiB of
// payload) with its own write call; a 128 KiB slot was 8 writes, each
// pushing its own segment and waking the consumer. Gathered, a 425 MiB
// fetch took 14-23% less CPU per byte on loopback (docs/PERFORMANCE.md,
// "TLS on the tcp data plane", issue 29).
const tlsBatchBytes = 256 << 10

// recordBatch is the socket under a dialer's TLS connection. Between
// start and flush (one payload's writes, on the goroutine sending it) it
// gathers the records crypto/tls writes and writes them tlsBatchBytes at
// a time; otherwise (the handshake, anything else) a write goes straight
// through. The sending worker gathers; mu also orders it against a write
// from elsewhere (Close's close_notify alert, sent by the goroutine that
// disconnects).
type recordBatch struct {
	net.Conn
	mu  sync.Mutex
	buf []byte // gathered records; nil until the first payload
	on  bool   // gathering
}

// batchOf is c's recordBatch, nil for a plain connection.
func batchOf(c net.Conn) *recordBatch {
	if tc, ok := c.(*tls.Conn); ok {
		b, _ := tc.NetConn().(*recordBatch)
		return b
	}
	return nil
}

// start gathers the writes that follow, until flush.
func (b *recordBatch) start() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf == nil {
		b.buf = make([]byte, 0, tlsBatchBytes)
	}
	b.on = true
}

func (b *recordBatch) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		return b.Conn.Write(p)
	}
	if len(b.buf)+len(p) > cap(b.buf) {
		if err := b.write(); err != nil {
			return 0, err
		}
	}
	if len(p) > cap(b.buf) {
		return b.Conn.Write(p)
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// flush writes what was gathered and stops gathering.
func (b *recordBatch) flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
	return b.write()
}

func (b *recordBatch) write() error {
	if len(b.buf) == 0 {
		return nil
	}
	_, err := b.Conn.Write(b.buf)
	b.buf = b.buf[:0]
	return err
}
