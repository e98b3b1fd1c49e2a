package tcp

import (
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvtier/kvtier/messages"
)

// Config configures a Transport. Zero fields take the defaults below.
type Config struct {
	Node            string        // this node's id, sent in every connection preface; 1..255 bytes
	Listen          string        // address the data-plane listener binds (Register); default DefaultListen
	Advertise       string        // host:port peers dial, carried in Metadata(); default: the listener's address
	WriteTimeout    time.Duration // bound on one Write (dial, send, ack) and on a new connection's preface; default DefaultWriteTimeout
	MaxConnsPerPeer int           // outbound connections per peer (concurrent Writes beyond it queue); default DefaultMaxConnsPerPeer
	// TLS, when set, makes every data-plane connection TLS 1.3, mutually
	// authenticated: its Certificates are this node's (presented both as a
	// server and as a client), RootCAs verify the peers' server
	// certificates and ClientCAs their client ones. A certificate must name
	// its node id (a DNS SAN): the dialer verifies the peer it writes to
	// under that name, and the listener refuses a connection whose preface
	// names another node than its certificate. nil: plain TCP.
	TLS *tls.Config
	Log zerolog.Logger
}

// Defaults for Config's zero fields.
const (
	DefaultListen          = "127.0.0.1:0"
	DefaultWriteTimeout    = 30 * time.Second
	DefaultMaxConnsPerPeer = 4
)

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Listen == "" {
		c.Listen = DefaultListen
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxConnsPerPeer == 0 {
		c.MaxConnsPerPeer = DefaultMaxConnsPerPeer
	}
	if c.Node == "" || len(c.Node) > maxNodeID {
		return c, fmt.Errorf("%w: rdma/tcp: node id %q: want 1..%d bytes", messages.ErrBadConfig, c.Node, maxNodeID)
	}
	if c.WriteTimeout < 0 || c.MaxConnsPerPeer < 0 {
		return c, fmt.Errorf("%w: rdma/tcp: write timeout %v, max conns per peer %d: want > 0",
			messages.ErrBadConfig, c.WriteTimeout, c.MaxConnsPerPeer)
	}
	if c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil {
		return c, fmt.Errorf("%w: rdma/tcp: tls without a certificate", messages.ErrBadConfig)
	}
	if c.Advertise != "" {
		if err := checkAddr(c.Advertise); err != nil {
			return c, fmt.Errorf("%w: rdma/tcp: advertise: %w", messages.ErrBadConfig, err)
		}
	}
	return c, nil
}

// checkAddr accepts a host:port that fits the metadata encoding.
func checkAddr(a string) error {
	if len(a) > maxAddr {
		return fmt.Errorf("address %q longer than %d bytes", a, maxAddr)
	}
	if _, _, err := net.SplitHostPort(a); err != nil {
		return err
	}
	return nil
}
