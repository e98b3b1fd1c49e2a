// Package testcerts makes certificate authorities and node certificates
// for tests and benchmarks of the data plane's TLS: each certificate names
// a node id as its DNS SAN, valid for an hour around now. Never for
// production keys.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"
)

// TB is the part of testing.TB these helpers use: a test passes its
// *testing.T; importing no testing package keeps it out of the shipped
// binaries that link these helpers (cmd/kvtier's bench).
type TB interface {
	Helper()
	Fatal(args ...any)
}

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// Pool trusts this CA alone.
	Pool *x509.CertPool
}

var serial atomic.Int64

// NewCA makes a CA (a test's).
func NewCA(t TB) *CA {
	t.Helper()
	ca, err := New()
	must(t, err)
	return ca
}

// New makes a CA.
func New() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: "kvtier test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	cert, err := create(tmpl, tmpl, key, key)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}, nil
}

// Issue signs a certificate naming node (for server and client auth) and
// returns it with its key.
func (ca *CA) Issue(t TB, node string) tls.Certificate {
	t.Helper()
	c, err := ca.issue(node)
	must(t, err)
	return c
}

func (ca *CA) issue(node string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: node},
		DNSNames: []string{node}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	cert, err := create(tmpl, ca.cert, key, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}, nil
}

// Config is a node's data-plane TLS: a certificate naming cert (usually
// the node's own id) issued by ca, trusting trust for both roles.
func (ca *CA) Config(t TB, cert string, trust *CA) *tls.Config {
	t.Helper()
	return &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, cert)}, RootCAs: trust.Pool, ClientCAs: trust.Pool}
}

// WriteFiles writes node's certificate, its key and this CA's certificate
// as PEM files in dir, and returns their paths.
func (ca *CA) WriteFiles(t TB, dir, node string) (cert, key, caFile string) {
	t.Helper()
	cert, key, caFile, err := ca.Files(dir, node)
	must(t, err)
	return cert, key, caFile
}

// Files is WriteFiles for a benchmark: errors returned.
func (ca *CA) Files(dir, node string) (cert, key, caFile string, err error) {
	c, err := ca.issue(node)
	if err != nil {
		return "", "", "", err
	}
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		return "", "", "", err
	}
	cert, key, caFile = filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key"), filepath.Join(dir, "ca.crt")
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{cert, "CERTIFICATE", c.Certificate[0]}, {key, "EC PRIVATE KEY", der}, {caFile, "CERTIFICATE", ca.cert.Raw}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return "", "", "", err
		}
	}
	return cert, key, caFile, nil
}

func must(t TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func create(tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) (*x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
