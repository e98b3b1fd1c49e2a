package discovery

import (
	"context"
	"fmt"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// List reads, once, the members registered under prefix (DefaultPrefix
// when empty), sorted by node id: for a reader of the fleet that is not a
// member itself (`kvtier fleet status`). Records that do not decode are
// returned in bad, by key, and left out of members.
func List(ctx context.Context, endpoints []string, prefix string, timeout time.Duration) (members []Member, bad map[string]error, err error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: etcd client: %w", errConfig, err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := cli.Get(ctx, prefix+nodesDir, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("discovery: list %s: %w", prefix+nodesDir, err)
	}
	bad = map[string]error{}
	for _, kv := range resp.Kvs {
		node, ok := nodeOf(prefix, string(kv.Key))
		if !ok {
			continue
		}
		m, err := decode(node, kv.Value)
		if err != nil {
			bad[string(kv.Key)] = err
			continue
		}
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool { return members[i].Node < members[j].Node })
	return members, bad, nil
}
