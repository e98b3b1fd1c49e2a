package tcp

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"

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

// dialTLS runs the client handshake on a fresh connection to node.
func dialTLS(ctx context.Context, conn net.Conn, c *tls.Config, node string) (net.Conn, error) {
	tc := tls.Client(conn, clientTLS(c, node))
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
		return tc.NetConn()
	}
	return c
}
