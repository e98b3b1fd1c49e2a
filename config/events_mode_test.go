package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvtier/kvtier/events"
	"github.com/kvtier/kvtier/messages"
)

// llm-d's topology in YAML: the node's PUB connects to the router's bound
// SUB, its learning SUB binds for engines that connect.
func TestEventsModesFromYAML(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
events:
  endpoint: "tcp://epp.llm-d.svc:5557"
  mode: connect
  learn_from: ["tcp://*:5558"]
  learn_mode: auto
`))
	require.NoError(t, err)
	c := cfg.WithDefaults()
	require.NoError(t, c.Validate())
	assert.Equal(t, events.ModeConnect, c.Events.Mode)
	assert.Equal(t, events.ModeAuto, c.Events.LearnMode)

	// Older configs say neither: the PUB binds, a learner connects to a
	// named host (auto) and binds only what cannot be connected to.
	old := Config{Events: EventsConfig{Endpoint: "tcp://127.0.0.1:5557", LearnFrom: []string{"tcp://127.0.0.1:5556"}}}.WithDefaults()
	require.NoError(t, old.Validate())
	assert.Equal(t, events.ModeBind, old.Events.Mode)
	assert.Equal(t, events.ModeAuto, old.Events.LearnMode)

	for name, e := range map[string]EventsConfig{
		"unknown mode":          {Endpoint: "tcp://*:5557", Mode: "listen"},
		"connect to wildcard":   {Endpoint: "tcp://*:5557", Mode: events.ModeConnect},
		"unknown learn mode":    {Endpoint: "tcp://*:5557", LearnFrom: []string{"tcp://a:1"}, LearnMode: "dial"},
		"learner to a wildcard": {Endpoint: "tcp://*:5557", LearnFrom: []string{"tcp://*:1"}, LearnMode: events.ModeConnect},
	} {
		err := Config{Events: e}.WithDefaults().Validate()
		assert.ErrorIs(t, err, messages.ErrBadConfig, name)
	}
}
