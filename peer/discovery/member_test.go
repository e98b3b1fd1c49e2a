package discovery

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func rec(node, control string) Member {
	return Member{Node: node, Control: control, Transport: "tcp", BlockBytes: 4096, Slots: 8, Protocol: 2,
		Started: time.Unix(1_700_000_000, 0).UTC(), Instance: "i-" + node}
}

func kinds(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.Kind) + " " + ev.Member.Node
	}
	return out
}

// The view reports each change once: itself never, an unchanged record
// never, a changed one (a restart elsewhere) as Joined with its new record.
func TestViewPutAndDelete(t *testing.T) {
	v := newView("me")
	require.Empty(t, v.put(rec("me", "tcp://a:1")), "this node is not its own member")
	require.Equal(t, []string{"joined b"}, kinds(v.put(rec("b", "tcp://b:1"))))
	require.Empty(t, v.put(rec("b", "tcp://b:1")), "the same record again: nothing")
	moved := v.put(rec("b", "tcp://b:2"))
	require.Equal(t, []string{"joined b"}, kinds(moved))
	require.Equal(t, "tcp://b:2", moved[0].Member.Control)
	require.Equal(t, []string{"left b"}, kinds(v.del("b")))
	require.Empty(t, v.del("b"), "a member leaves once")
}

// A fresh listing makes the view exactly that: whoever it lacks left,
// whoever is new or changed joined, in node order.
func TestViewResetDiffs(t *testing.T) {
	v := newView("me")
	v.put(rec("b", "tcp://b:1"))
	v.put(rec("c", "tcp://c:1"))
	evs := v.reset([]Member{rec("me", "tcp://a:1"), rec("d", "tcp://d:1"), rec("c", "tcp://c:9"), rec("e", "tcp://e:1")})
	require.Equal(t, []string{"left b", "joined c", "joined d", "joined e"}, kinds(evs))
	require.Equal(t, []string{"c", "d", "e"}, v.nodes())
	require.Empty(t, v.reset([]Member{rec("c", "tcp://c:9"), rec("d", "tcp://d:1"), rec("e", "tcp://e:1")}))
}

func TestDecodeChecksTheKeysNode(t *testing.T) {
	_, err := decode("b", []byte(`{"node_id":"c","control":"tcp://c:1"}`))
	require.True(t, errors.Is(err, errBadRecord), "a record under another node's key: %v", err)
	_, err = decode("b", []byte(`{"node_id":"b"}`))
	require.ErrorIs(t, err, errBadRecord, "no control address")
	_, err = decode("b", []byte(`not json`))
	require.ErrorIs(t, err, errBadRecord)
	m, err := decode("b", []byte(`{"node_id":"b","control":"tcp://b:1","future_field":1}`))
	require.NoError(t, err, "fields of a newer kvtier are ignored")
	require.Equal(t, "tcp://b:1", m.Control)
}

func TestNodeOf(t *testing.T) {
	id, ok := nodeOf("/kvtier/", "/kvtier/nodes/a")
	require.True(t, ok)
	require.Equal(t, "a", id)
	_, ok = nodeOf("/kvtier/", "/kvtier/nodes/")
	require.False(t, ok)
	_, ok = nodeOf("/kvtier/", "/other/nodes/a")
	require.False(t, ok)
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Endpoints: []string{"127.0.0.1:2379"}, Self: rec("a", "tcp://a:1")}.WithDefaults()
	require.NoError(t, ok.Validate())
	require.Equal(t, DefaultTTL/2, ok.RetryMax, "retries never wait past half a lease")
	for name, c := range map[string]Config{
		"no endpoints":   {Self: rec("a", "tcp://a:1")},
		"no node":        {Endpoints: ok.Endpoints, Self: Member{Control: "tcp://a:1"}},
		"prefix":         {Endpoints: ok.Endpoints, Self: ok.Self, Prefix: "kvtier"},
		"ttl too short":  {Endpoints: ok.Endpoints, Self: ok.Self, TTL: time.Second},
		"ttl fractional": {Endpoints: ok.Endpoints, Self: ok.Self, TTL: 2500 * time.Millisecond},
	} {
		require.ErrorIs(t, c.WithDefaults().Validate(), errConfig, name)
	}
}
