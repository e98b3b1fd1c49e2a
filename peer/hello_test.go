package peer

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/peer/wire"
	"github.com/kvtier/kvtier/rdma"
)

// kindOnly is a data plane that only names its kind: all a Hello's
// admission reads of it.
type kindOnly struct {
	rdma.Transport
	kind string
}

func (k kindOnly) Kind() string { return k.kind }

// An inbound Hello is welcomed only from the connection's own identity, on
// the allow-list, with this node's protocol, block geometry and data plane
// and a namespace in common; a frame that did not decode is dropped
// unanswered (counted), one of another version refused with a reason; a
// draining node refuses every well-formed Hello.
func TestAdmitHello(t *testing.T) {
	cfg := &Config{Node: "us", Namespaces: []string{"ns-a", "ns-b"}, BlockBytes: 4096,
		Transport: kindOnly{kind: "tcp"}, Allow: []string{"them"}}
	hello := func(mod func(*wire.Hello)) *wire.Hello {
		h := &wire.Hello{Version: wire.Version, Node: "them", Namespaces: []string{"ns-b"}, BlockBytes: 4096, Transport: "tcp"}
		if mod != nil {
			mod(h)
		}
		return h
	}
	malformed := &wire.Error{Kind: wire.ErrMalformed, Field: "node"}
	for _, c := range []struct {
		name     string
		h        *wire.Hello
		draining bool
		err      error
		want     helloVerdict
	}{
		{"welcome", hello(nil), false, nil, helloVerdict{}},
		{"any namespace on their side", hello(func(h *wire.Hello) { h.Namespaces = nil }), false, nil, helloVerdict{}},
		{"draining", hello(nil), true, nil, helloVerdict{refuse: wire.RefuseShutdown, msg: "the node is stopping"}},
		{"another version", hello(func(h *wire.Hello) { h.Version = wire.Version + 1 }), false,
			&wire.Error{Kind: wire.ErrVersion}, helloVerdict{refuse: wire.RefuseVersion,
				msg: fmt.Sprintf("version %d; this node speaks %d", wire.Version+1, wire.Version)}},
		{"malformed, even draining", hello(nil), true, malformed, helloVerdict{drop: wire.Reason(malformed)}},
		{"not the connection's identity", hello(func(h *wire.Hello) { h.Node = "mallory" }), false, nil,
			helloVerdict{refuse: wire.RefuseAuth, msg: "node id differs from the connection's identity"}},
		// A slot size of its own is no reason to refuse: blocks carry their lengths.
		{"larger slots", hello(func(h *wire.Hello) { h.BlockBytes = 8192 }), false, nil, helloVerdict{}},
		{"smaller slots", hello(func(h *wire.Hello) { h.BlockBytes = 1024 }), false, nil, helloVerdict{}},
		{"data plane", hello(func(h *wire.Hello) { h.Transport = "nixl" }), false, nil,
			helloVerdict{refuse: wire.RefuseTransport, msg: `transport "nixl", ours "tcp"`}},
		{"no namespace in common", hello(func(h *wire.Hello) { h.Namespaces = []string{"ns-z"} }), false, nil,
			helloVerdict{refuse: wire.RefuseNamespace, msg: "no namespace in common"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			node := c.h.Node
			if c.name == "not the connection's identity" {
				node = "them"
			}
			require.Equal(t, c.want, admitHello(cfg, node, c.draining, c.h, c.err))
		})
	}
	t.Run("not on the allow-list", func(t *testing.T) {
		h := hello(func(h *wire.Hello) { h.Node = "stranger" })
		require.Equal(t, helloVerdict{refuse: wire.RefuseNotAllow, msg: "not on the allow-list"}, admitHello(cfg, "stranger", false, h, nil))
	})
}
