package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func TestDiscoveryConfigValidation(t *testing.T) {
	base := func(d DiscoveryConfig) PeersConfig {
		return PeersConfig{NodeID: "a", Listen: "tcp://127.0.0.1:0", Secret: "0123456789abcdef-test-secret", Discovery: d}
	}
	etcd := func(f func(*DiscoveryConfig)) DiscoveryConfig {
		d := DiscoveryConfig{Kind: "etcd", Endpoints: []string{"http://127.0.0.1:2379"}}
		f(&d)
		return d
	}
	require.NoError(t, base(etcd(func(*DiscoveryConfig) {})).validate())
	require.NoError(t, base(etcd(func(d *DiscoveryConfig) {
		d.Endpoints, d.Prefix, d.TTL, d.Advertise = []string{"10.0.0.2:2379", "https://etcd:2379"}, "/fleet-1/", 5*time.Second, "tcp://10.0.0.5:7600"
	})).validate())
	for name, tc := range map[string]struct {
		p    PeersConfig
		want string
	}{
		"no kind":       {base(DiscoveryConfig{Endpoints: []string{"127.0.0.1:2379"}}), "kind is required"},
		"unknown kind":  {base(etcd(func(d *DiscoveryConfig) { d.Kind = "consul" })), `kind "consul"`},
		"no endpoints":  {base(etcd(func(d *DiscoveryConfig) { d.Endpoints = nil })), "endpoints are required"},
		"bad endpoint":  {base(etcd(func(d *DiscoveryConfig) { d.Endpoints = []string{"unix:///x"} })), `endpoint "unix:///x"`},
		"no port":       {base(etcd(func(d *DiscoveryConfig) { d.Endpoints = []string{"http://etcd"} })), `endpoint "http://etcd"`},
		"prefix":        {base(etcd(func(d *DiscoveryConfig) { d.Prefix = "kvtier" })), "prefix"},
		"short ttl":     {base(etcd(func(d *DiscoveryConfig) { d.TTL = time.Second })), "ttl 1s"},
		"fraction ttl":  {base(etcd(func(d *DiscoveryConfig) { d.TTL = 2500 * time.Millisecond })), "whole seconds"},
		"bad advertise": {base(etcd(func(d *DiscoveryConfig) { d.Advertise = "10.0.0.5:7600" })), "advertise"},
		"no listen":     {PeersConfig{Discovery: etcd(func(*DiscoveryConfig) {})}, "listen is required"},
	} {
		err := tc.p.validate()
		require.ErrorIs(t, err, messages.ErrBadConfig, name)
		require.ErrorContains(t, err, tc.want, name)
	}
}
