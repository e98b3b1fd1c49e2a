package config

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
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
//	  discovery:                          # and/or: members found in etcd (docs/OPERATIONS.md)
//	    kind: etcd
//	    endpoints: [http://10.0.0.2:2379]
//	    prefix: /kvtier/                  # keys: <prefix>nodes/<node_id>
//	    ttl: 10s                          # lease: a dead node leaves the others' view this long after
//	    advertise: tcp://10.0.0.5:7600    # control address registered (default: the bound listen address)
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
	// Discovery finds more peers in etcd: the node registers itself and
	// dials the members it finds (static peers keep working beside them).
	// Discovered peers still prove the secret and must be allowed.
	Discovery DiscoveryConfig `yaml:"discovery"`
	// Directory asks, on a miss, only the peers whose KV events say they
	// hold one of its keys, instead of every ready peer (tiers/p2p). A
	// peer's events come from its static entry's events addresses or its
	// etcd record; a peer whose events this node cannot read is asked when
	// no peer is named. Needs this node's events on to advertise its own.
	Directory bool `yaml:"directory"`
	// Allow lists the node ids that may open sessions; empty: any node that
	// proves the secret. Static peers are always allowed; discovered ones
	// only when listed.
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

// Load builds the tls.Config, or nil while TLS is off.
func (c PeersTLSConfig) Load() (*tls.Config, error) {
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

// DiscoveryConfig is peers.discovery in YAML: fleet membership on etcd
// (peer/discovery), off while Kind is empty. etcd failures are not the
// node's: an unreachable etcd at start or later is retried with backoff,
// and sessions to peers already found keep serving (docs/OPERATIONS.md).
type DiscoveryConfig struct {
	// Kind is the membership store: "etcd" (the only one), or empty: off.
	Kind string `yaml:"kind"`
	// Endpoints are etcd's client URLs: http://host:port, https://host:port
	// or host:port.
	Endpoints []string `yaml:"endpoints"`
	// Prefix roots the keys: a node registers <prefix>nodes/<node_id>
	// (default /kvtier/; a fleet per prefix).
	Prefix string `yaml:"prefix"`
	// TTL is the lease of the registration, whole seconds, at least 2s
	// (default 10s): a node that dies without closing leaves the others'
	// view this long after.
	TTL time.Duration `yaml:"ttl"`
	// Timeout bounds each etcd request, and the registration that Open
	// waits for (default 2s).
	Timeout time.Duration `yaml:"timeout"`
	// Advertise is the control-plane address registered for peers to dial,
	// tcp://host:port (default: the bound listen address; set it when
	// listen binds all interfaces).
	Advertise string `yaml:"advertise"`
	// Metrics is the node's /metrics URL, registered for `kvtier fleet
	// status` (kvtierd sets it from --metrics-listen when empty).
	Metrics string `yaml:"metrics"`
}

// Enabled reports whether discovery is on.
func (d DiscoveryConfig) Enabled() bool { return d.Kind != "" }

// validate checks the section, naming the field at fault.
func (d DiscoveryConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: peers.discovery: "+format, append([]any{messages.ErrBadConfig}, args...)...)
	}
	if !d.Enabled() {
		if len(d.Endpoints) > 0 || d.Prefix != "" || d.TTL != 0 || d.Timeout != 0 || d.Advertise != "" || d.Metrics != "" {
			return bad("kind is required (etcd)")
		}
		return nil
	}
	switch {
	case d.Kind != "etcd":
		return bad("kind %q (want etcd)", d.Kind)
	case len(d.Endpoints) == 0:
		return bad("endpoints are required")
	case d.Prefix != "" && (!strings.HasPrefix(d.Prefix, "/") || !strings.HasSuffix(d.Prefix, "/")):
		return bad("prefix %q must start and end with /", d.Prefix)
	case d.TTL != 0 && (d.TTL < 2*time.Second || d.TTL%time.Second != 0):
		return bad("ttl %v must be whole seconds, at least 2s (etcd's shortest lease)", d.TTL)
	case d.Timeout < 0:
		return bad("timeout %v must be positive", d.Timeout)
	case d.Advertise != "" && !validTCPAddr(d.Advertise):
		return bad("advertise %q: want tcp://host:port", d.Advertise)
	}
	for _, e := range d.Endpoints {
		if !validEndpoint(e) {
			return bad("endpoint %q: want http://host:port, https://host:port or host:port", e)
		}
	}
	return nil
}

// validEndpoint reports whether e is an etcd client URL the client takes.
func validEndpoint(e string) bool {
	hostPort := e
	if scheme, rest, ok := strings.Cut(e, "://"); ok {
		if scheme != "http" && scheme != "https" {
			return false
		}
		hostPort = rest
	}
	host, port, err := net.SplitHostPort(hostPort)
	return err == nil && host != "" && port != ""
}

// validTCPAddr reports whether a is tcp://host:port with both parts.
func validTCPAddr(a string) bool {
	rest, ok := strings.CutPrefix(a, "tcp://")
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(rest)
	return err == nil && host != "" && port != "" && port != "0"
}

// PeerAddr is one static peer.
type PeerAddr struct {
	NodeID string `yaml:"node_id"`
	Addr   string `yaml:"addr"`
	// Events and EventsReplay are where the peer publishes its KV events
	// (its events.endpoint and events.replay), for the directory.
	Events       string `yaml:"events"`
	EventsReplay string `yaml:"events_replay"`
}

// Enabled reports whether the P2P tier is on.
func (p PeersConfig) Enabled() bool { return p.Listen != "" }

func (p PeersConfig) validate() error {
	if !p.Enabled() {
		if p.NodeID != "" || len(p.Static) > 0 || p.Discovery.Enabled() {
			return fmt.Errorf("%w: peers: listen is required when peers are configured", messages.ErrBadConfig)
		}
		return p.Discovery.validate()
	}
	switch {
	case p.NodeID == "":
		return fmt.Errorf("%w: peers: node_id is required", messages.ErrBadConfig)
	case p.Secret != "" && p.SecretFile != "":
		return fmt.Errorf("%w: peers: set secret or secret_file, not both", messages.ErrBadConfig)
	case p.Transport != "" && p.Transport != "tcp" && p.Transport != "nixl":
		return fmt.Errorf("%w: peers: transport %q (want tcp or nixl)", messages.ErrBadConfig, p.Transport)
	}
	return p.Discovery.validate()
}

// SecretBytes returns the shared secret, from the config or its file.
func (p PeersConfig) SecretBytes() ([]byte, error) {
	if p.SecretFile == "" {
		return []byte(p.Secret), nil
	}
	b, err := os.ReadFile(p.SecretFile)
	if err != nil {
		return nil, fmt.Errorf("%w: peers: secret_file: %w", messages.ErrBadConfig, err)
	}
	return []byte(strings.TrimSpace(string(b))), nil
}
