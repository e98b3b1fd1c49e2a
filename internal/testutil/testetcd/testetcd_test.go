package testetcd

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The client kvtier builds against (go.etcd.io/etcd/client/v3 v3.7) speaks
// to the server the tests run (Debian's etcd 3.4): every call the
// discovery package makes — lease grant, keep-alive and revoke, a
// transaction on a key's create revision, get by prefix, watch from a
// revision — works across that version gap, and survives a restart.
func TestClientV37AgainstServer(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()

	lease, err := cli.Grant(ctx, 2)
	require.NoError(t, err)
	ka, err := cli.KeepAlive(ctx, lease.ID)
	require.NoError(t, err)
	require.NotNil(t, <-ka, "a keep-alive is answered")

	create := func(v string) *clientv3.TxnResponse {
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision("/k/a"), "=", 0)).
			Then(clientv3.OpPut("/k/a", v, clientv3.WithLease(lease.ID))).Else(clientv3.OpGet("/k/a")).Commit()
		require.NoError(t, err)
		return resp
	}
	require.True(t, create("one").Succeeded)
	second := create("two")
	require.False(t, second.Succeeded, "the key exists: the transaction's else branch runs")
	require.Equal(t, "one", string(second.Responses[0].GetResponseRange().Kvs[0].Value))

	got, err := cli.Get(ctx, "/k/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, got.Kvs, 1)
	w := cli.Watch(ctx, "/k/", clientv3.WithPrefix(), clientv3.WithRev(got.Header.Revision+1))
	_, err = cli.Revoke(ctx, lease.ID)
	require.NoError(t, err)
	ev := <-w
	require.NoError(t, ev.Err())
	require.Len(t, ev.Events, 1)
	require.Equal(t, clientv3.EventTypeDelete, ev.Events[0].Type, "revoking the lease deletes its key")

	require.NoError(t, s.Restart(ctx))
	_, err = cli.Put(ctx, "/k/b", "after restart")
	require.NoError(t, err, "the client reconnects to the restarted server")
}

// Killed, the endpoint refuses connections as a dead etcd's would, and no
// other socket can take its port; restarted on ports of its own, etcd
// answers behind the same endpoint with its data, and wiped, without it.
func TestEndpointOutlivesRestarts(t *testing.T) {
	s := Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := s.Client(t)
	_, err := cli.Put(ctx, "/k", "v")
	require.NoError(t, err)
	endpoint := s.Endpoint()
	addr := strings.TrimPrefix(endpoint, "http://")

	s.Kill()
	_, err = net.Dial("tcp", addr)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "killed: refused")
	if ln, err := net.Listen("tcp", addr); err == nil {
		_ = ln.Close()
		t.Fatal("the endpoint's port was free while etcd was down")
	}

	require.NoError(t, s.Restart(ctx))
	require.Equal(t, endpoint, s.Endpoint())
	got, err := cli.Get(ctx, "/k")
	require.NoError(t, err)
	require.Len(t, got.Kvs, 1, "restarted over its data")

	require.NoError(t, s.Wipe(ctx))
	got, err = cli.Get(ctx, "/k")
	require.NoError(t, err)
	require.Empty(t, got.Kvs, "wiped")
}
