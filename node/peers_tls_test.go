package node

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/internal/testutil/testcerts"
	"github.com/kvtier/kvtier/messages"
)

// Two nodes whose data plane is TLS (peers.tls, PEM files): blocks cross
// and verify; a half-given tls section is a config error.
func TestPeersFetchOverTLS(t *testing.T) {
	ca, dir := testcerts.NewCA(t), t.TempDir()
	withTLS := func(node string) func(*config.Config) {
		cert, key, caFile := ca.WriteFiles(t, dir, node)
		return func(c *config.Config) { c.Peers.TLS = config.PeersTLSConfig{Cert: cert, Key: key, CA: caFile} }
	}
	prod := open(t, 64, withPeers("prod"), withTLS("prod"))
	cons := open(t, 64, withPeers("cons", config.PeerAddr{NodeID: "prod", Addr: prod.node.PeerAddr()}), withTLS("cons"))
	require.NoError(t, cons.node.WaitPeers(cons.ctx, "prod"))
	prod.storeReady(ids(0, 16)...)

	req := &messages.ReqContext{RequestID: "r"}
	ks := keys(ids(0, 16)...)
	require.Equal(t, messages.Retry, cons.lookup(req, ks, true)[0])
	cons.idle()
	require.Equal(t, statuses(16, messages.Hit), cons.lookup(req, ks, true), "fetched over TLS")
	cons.loadAndVerify(req, ids(0, 16)...)
	cons.quiet()

	// A node whose certificate another CA signed passes the control plane
	// (it has the secret) but cannot write or be written to: nothing crosses.
	other, otherDir := testcerts.NewCA(t), t.TempDir()
	cert, key, caFile := other.WriteFiles(t, otherDir, "stranger")
	stranger := open(t, 64, withPeers("stranger", config.PeerAddr{NodeID: "prod", Addr: prod.node.PeerAddr()}),
		func(c *config.Config) { c.Peers.TLS = config.PeersTLSConfig{Cert: cert, Key: key, CA: caFile} })
	require.NoError(t, stranger.node.WaitPeers(stranger.ctx, "prod"))
	sreq := &messages.ReqContext{RequestID: "s"}
	require.Equal(t, messages.Retry, stranger.lookup(sreq, ks, true)[0])
	stranger.idle()
	require.Equal(t, messages.Miss, stranger.lookup(sreq, ks, true)[0], "no block crosses without a trusted certificate")
	stranger.quiet()
	prod.quiet()

	_, err := Open(context.Background(), config.Config{PoolBytes: 16 * testBlock, BlockBytes: testBlock,
		Peers: config.PeersConfig{NodeID: "x", Listen: "tcp://127.0.0.1:0", Secret: testSecret, TLS: config.PeersTLSConfig{Cert: "a.crt"}}})
	require.True(t, errors.Is(err, messages.ErrBadConfig), "%v", err)
}
