package kvtier

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/rdma"
)

// PeersConfig turns on the P2P tier: this node serves its CPU tier to
// other kvtier nodes and fetches from them on a miss. In YAML:
//
//	peers:
//	  node_id: node-a
//	  listen: tcp://0.0.0.0:7600          # control plane (ZeroMQ ROUTER)
//	  data_listen: 0.0.0.0:7601           # tcp data plane
//	  data_advertise: 10.0.0.5:7601       # what peers dial (default: data_listen)
//	  secret_file: /etc/kvtier/peer.key   # shared HMAC secret (or secret:)
//	  static:
//	    - {node_id: node-b, addr: tcp://10.0.0.6:7600}
//	  allow: [node-b, node-c]             # empty: any node proving the secret
//	  transport: tcp                      # or nixl (build tag nixl)
//	  tls: {cert: /etc/kvtier/node-a.crt, key: /etc/kvtier/node-a.key, ca: /etc/kvtier/ca.crt}  # tcp data plane: mutual TLS 1.3
type PeersConfig struct {
	// NodeID is this node's id, proven to peers in the handshake. Peers are
	// off while Listen is empty.
	NodeID string `yaml:"node_id"`
	// Listen is the control-plane address, tcp://host:port.
	Listen string `yaml:"listen"`
	// DataListen and DataAdvertise: the tcp data plane's bind address and
	// the address peers dial (default: the bound one).
	DataListen    string `yaml:"data_listen"`
	DataAdvertise string `yaml:"data_advertise"`
	// Secret (or SecretFile, read at Open) is the shared HMAC secret, at
	// least 16 bytes.
	Secret     string `yaml:"secret"`
	SecretFile string `yaml:"secret_file"`
	// Static are the peers this node dials.
	Static []PeerAddr `yaml:"static"`
	// Allow lists the node ids that may open sessions; empty: any node that
	// proves the secret. Static peers are always allowed.
	Allow []string `yaml:"allow"`
	// Namespaces shared with peers; empty: any.
	Namespaces []string `yaml:"namespaces"`
	// Transport is the data plane: "tcp" (default) or "nixl".
	Transport string `yaml:"transport"`
	// Nixl configures the nixl data plane (transport: nixl; docs/NIXL.md).
	Nixl NixlConfig `yaml:"nixl"`
	// TLS makes the tcp data plane TLS 1.3 with mutual authentication.
	TLS PeersTLSConfig `yaml:"tls"`
	// TierName names the P2P tier in stats and TierFilter (default "peers").
	TierName string `yaml:"tier_name"`

	LeaseTTL          time.Duration `yaml:"lease_ttl"`          // producer lease of a round's hits (30s)
	LookupTimeout     time.Duration `yaml:"lookup_timeout"`     // a Lookup round's deadline (1s)
	FetchTimeout      time.Duration `yaml:"fetch_timeout"`      // a Fetch round's deadline (10s)
	HoldTimeout       time.Duration `yaml:"hold_timeout"`       // unfetched hits held before release (5s)
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval"` // Ping period while a round is in flight (2s; none when idle; negative: off)

	// TransportImpl replaces the data plane (tests, fault injection).
	TransportImpl rdma.Transport `yaml:"-"`
}

// PeersTLSConfig is the tcp data plane's TLS (peers.tls in YAML): off while
// Cert is empty. The node presents Cert/Key (PEM) as a server and as a
// client; CA (PEM) verifies the peers'. Each node's certificate must name
// its node id as a DNS SAN: a peer writes only as the node its certificate
// names, and is written to only under that name.
type PeersTLSConfig struct {
	Cert string `yaml:"cert"` // certificate chain file
	Key  string `yaml:"key"`  // its private key file
	CA   string `yaml:"ca"`   // the CA bundle that signs the peers' certificates
}

// load builds the tls.Config, or nil while TLS is off.
func (c PeersTLSConfig) load() (*tls.Config, error) {
	if c.Cert == "" && c.Key == "" && c.CA == "" {
		return nil, nil
	}
	if c.Cert == "" || c.Key == "" || c.CA == "" {
		return nil, fmt.Errorf("%w: peers.tls needs cert, key and ca", messages.ErrBadConfig)
	}
	pair, err := tls.LoadX509KeyPair(c.Cert, c.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: peers.tls: %w", messages.ErrBadConfig, err)
	}
	pem, err := os.ReadFile(c.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: peers.tls: %w", messages.ErrBadConfig, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: peers.tls: no certificate in %s", messages.ErrBadConfig, c.CA)
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ClientCAs: pool}, nil
}

// NixlConfig is the nixl data plane's section (peers.nixl in YAML).
type NixlConfig struct {
	// Library is the path of libnixl_capi.so (default: $KVTIER_NIXL_LIB).
	Library string `yaml:"library"`
	// PluginDir is NIXL's plugin directory (default: $NIXL_PLUGIN_DIR).
	PluginDir string `yaml:"plugin_dir"`
	// Backend is the NIXL backend plugin (default "UCX"); BackendParams are
	// handed to it unchanged. UCX picks its transports from UCX_TLS.
	Backend       string            `yaml:"backend"`
	BackendParams map[string]string `yaml:"backend_params"`
	// WriteTimeout bounds one write (10s); LateWriteGrace is how long a
	// canceled fetch keeps its slots in case a posted remote write still
	// lands (15s; must exceed the peers' WriteTimeout).
	WriteTimeout   time.Duration `yaml:"write_timeout"`
	LateWriteGrace time.Duration `yaml:"late_write_grace"`
}

// PeerAddr is one static peer.
type PeerAddr struct {
	NodeID string `yaml:"node_id"`
	Addr   string `yaml:"addr"`
}

// Enabled reports whether the P2P tier is on.
func (p PeersConfig) Enabled() bool { return p.Listen != "" }

func (p PeersConfig) validate() error {
	if !p.Enabled() {
		if p.NodeID != "" || len(p.Static) > 0 {
			return fmt.Errorf("%w: peers: listen is required when peers are configured", messages.ErrBadConfig)
		}
		return nil
	}
	switch {
	case p.NodeID == "":
		return fmt.Errorf("%w: peers: node_id is required", messages.ErrBadConfig)
	case p.Secret != "" && p.SecretFile != "":
		return fmt.Errorf("%w: peers: set secret or secret_file, not both", messages.ErrBadConfig)
	case p.Transport != "" && p.Transport != "tcp" && p.Transport != "nixl":
		return fmt.Errorf("%w: peers: transport %q (want tcp or nixl)", messages.ErrBadConfig, p.Transport)
	}
	return nil
}

// secret returns the shared secret, from the config or its file.
func (p PeersConfig) secret() ([]byte, error) {
	if p.SecretFile == "" {
		return []byte(p.Secret), nil
	}
	b, err := os.ReadFile(p.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("%w: peers: secret_file: %w", messages.ErrBadConfig, err)
	}
	return []byte(strings.TrimSpace(string(b))), nil
}
