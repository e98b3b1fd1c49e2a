package node

import (
	"github.com/kvtier/kvtier/config"
	"github.com/kvtier/kvtier/engine"
)

// The node reads its configuration in the config package's words; these
// names keep the wiring's code short.
type (
	Config          = config.Config
	TierConfig      = config.TierConfig
	PeersConfig     = config.PeersConfig
	PeerAddr        = config.PeerAddr
	PeersTLSConfig  = config.PeersTLSConfig
	DiscoveryConfig = config.DiscoveryConfig
	EventsConfig    = config.EventsConfig
	NixlConfig      = config.NixlConfig
	ByteSize        = config.ByteSize
)

// The engine API the embedded node serves (engine.Manager, documented call
// by call there).
type (
	Manager    = engine.Manager
	SlotMemory = engine.SlotMemory
)
