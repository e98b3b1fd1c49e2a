// Package testcerts makes certificate authorities and node certificates
// for tests of the data plane's TLS: each certificate names a node id as
// its DNS SAN, valid for an hour around now. Never for production keys.
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
	"testing"
	"time"
)

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// Pool trusts this CA alone.
	Pool *x509.CertPool
}

var serial atomic.Int64

// NewCA makes a CA.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: "kvtier test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	cert := create(t, tmpl, tmpl, key, key)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}
}

// Issue signs a certificate naming node (for server and client auth) and
// returns it with its key.
func (ca *CA) Issue(t testing.TB, node string) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial.Add(1)), Subject: pkix.Name{CommonName: node},
		DNSNames: []string{node}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	cert := create(t, tmpl, ca.cert, key, ca.key)
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

// Config is a node's data-plane TLS: a certificate naming cert (usually
// the node's own id) issued by ca, trusting trust for both roles.
func (ca *CA) Config(t testing.TB, cert string, trust *CA) *tls.Config {
	t.Helper()
	return &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, cert)}, RootCAs: trust.Pool, ClientCAs: trust.Pool}
}

// WriteFiles writes node's certificate, its key and this CA's certificate
// as PEM files in dir, and returns their paths.
func (ca *CA) WriteFiles(t testing.TB, dir, node string) (cert, key, caFile string) {
	t.Helper()
	c := ca.Issue(t, node)
	der, err := x509.MarshalECPrivateKey(c.PrivateKey.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	cert, key, caFile = filepath.Join(dir, node+".crt"), filepath.Join(dir, node+".key"), filepath.Join(dir, "ca.crt")
	writePEM(t, cert, "CERTIFICATE", c.Certificate[0])
	writePEM(t, key, "EC PRIVATE KEY", der)
	writePEM(t, caFile, "CERTIFICATE", ca.cert.Raw)
	return cert, key, caFile
}

func writePEM(t testing.TB, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func create(t testing.TB, tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
