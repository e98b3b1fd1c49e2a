package config

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/messages"
)

func TestEventsConfigFromYAMLAndDefaults(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
events:
  endpoint: "tcp://*:5557"
  replay: "tcp://*:5558"
  node_id: n7
  model: llama
  hash_format: bytes
  linger: 50ms
  learn_from: ["tcp://127.0.0.1:5557"]
`))
	require.NoError(t, err)
	c := cfg.WithDefaults()
	require.NoError(t, c.Validate())
	assert.Equal(t, "tcp://*:5557", c.Events.Endpoint)
	assert.Equal(t, "kv@n7@llama", c.Events.Topic)
	assert.Equal(t, 10_000, c.Events.BufferBatches)
	assert.Equal(t, 50*time.Millisecond, c.Events.Linger)
	assert.Equal(t, []string{"tcp://127.0.0.1:5557"}, c.Events.LearnFrom)
	assert.Equal(t, 65536, c.Events.LearnCapacity)
	assert.Equal(t, 500*time.Millisecond, c.Events.LearnWait)

	off := Config{}.WithDefaults()
	assert.False(t, off.Events.Enabled())
	assert.Empty(t, off.Events.Topic, "no defaults while off")

	for name, e := range map[string]EventsConfig{
		"replay without endpoint": {Replay: "tcp://*:5558"},
		"bad scheme":              {Endpoint: "udp://x:1"},
		"bad hash format":         {Endpoint: "tcp://*:1", HashFormat: "hex"},
		"bad encoding":            {Endpoint: "tcp://*:1", Encoding: "json"},
		"negative buffer":         {Endpoint: "tcp://*:1", BufferBatches: -1},
		"learning, no endpoint":   {LearnFrom: []string{"tcp://127.0.0.1:5557"}},
		"learning, bad address":   {Endpoint: "tcp://*:1", LearnFrom: []string{"127.0.0.1:5557"}},
	} {
		err := Config{Events: e}.WithDefaults().Validate()
		assert.True(t, errors.Is(err, messages.ErrBadConfig), "%s: %v", name, err)
	}
	_, err = ParseConfig([]byte("events:\n  endpoit: x\n"))
	assert.ErrorIs(t, err, messages.ErrBadConfig, "unknown nested key")
}
