package kvtier_test

import (
	"context"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/scheduler/client"
)

// The standalone mode of the behaviour tests (node_test.go) drives the node
// through the real client: a DEALER socket on the engine endpoint and the
// pool mapped from its file.
func init() {
	kvtier.DialStandalone = func(ctx context.Context, addr, name string) (kvtier.Manager, func(context.Context) error, error) {
		c, err := client.Dial(ctx, addr, client.Options{Name: name})
		if err != nil {
			return nil, nil, err
		}
		return c, c.Close, nil
	}
}
