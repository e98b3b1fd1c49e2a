//go:build nixl

package tests

// Two kvtierd processes built with -tags nixl move blocks between their
// pools through NIXL (UCX; UCX_TLS=tcp on machines without RDMA) and every
// byte verifies. scripts/nixl.sh runs it with the library installed; it
// skips, saying why, when KVTIER_NIXL_LIB is not set.

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/internal/testutil/gobuild"

	"github.com/kvtier/kvtier/messages"
)

func buildDaemonNixl(t *testing.T) string {
	t.Helper()
	return gobuild.Command(t, "github.com/kvtier/kvtier/cmd/kvtierd", "kvtierd", "nixl")
}

func TestNixlTwoDaemonsFetchVerified(t *testing.T) {
	if os.Getenv("KVTIER_NIXL_LIB") == "" {
		t.Skip("KVTIER_NIXL_LIB is not set: NIXL is not installed here (scripts/nixl.sh installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	bin := buildDaemonNixl(t)
	a := startPeerDaemon(t, ctx, bin, "a", "--peer-transport", "nixl")
	b := startPeerDaemon(t, ctx, bin, "b", "--peer-transport", "nixl", "--peer", "a="+a.peer)
	rec, err := b.stderr.WaitJSON(ctx, "kvtier peers: data plane backend nixl")
	require.NoError(t, err)
	require.Equal(t, "UCX", rec["backend"], "the startup line names the backend")
	b.waitPeerReady(t, ctx, "a")

	ks := peerKeys(0, 300)
	a.storeBlocks(t, ctx, ks)
	req := &messages.ReqContext{RequestID: "r"}
	require.Equal(t, allStatus(len(ks), messages.Hit), b.lookupSettled(t, ctx, req, ks, messages.Retry, messages.HitPending))
	b.loadAndVerify(t, ctx, req, ks)
	b.requireQuiet(t, ctx)
	a.requireQuiet(t, ctx)
	require.Equal(t, float64(len(ks)), b.metric(t, ctx, `kvtier_peer_fetched_blocks_total{peer="a"}`))
	require.Positive(t, b.metric(t, ctx, `kvtier_rdma_bytes_received_total{kind="nixl"}`), "the bytes came through nixl")
}
