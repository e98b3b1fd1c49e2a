package kvtier

import "github.com/kvtier/kvtier/config"

// A node's configuration, documented field by field in the config package.
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

// Defaults: a laptop-sized pool (config's).
const (
	DefaultPoolBytes        = config.DefaultPoolBytes
	DefaultBlockBytes       = config.DefaultBlockBytes
	DefaultLeaseTTL         = config.DefaultLeaseTTL
	DefaultJobWorkers       = config.DefaultJobWorkers
	DefaultEngineJobTimeout = config.DefaultEngineJobTimeout
	DefaultCallTimeout      = config.DefaultCallTimeout
	DefaultEngineGrace      = config.DefaultEngineGrace
)

// LoadConfigFile reads a YAML config file (config.LoadConfigFile).
func LoadConfigFile(path string) (Config, error) { return config.LoadConfigFile(path) }

// ParseConfig decodes a YAML config (config.ParseConfig).
func ParseConfig(data []byte) (Config, error) { return config.ParseConfig(data) }

// ParseByteSize parses a size such as "64MiB" or "1G" (config.ParseByteSize).
func ParseByteSize(s string) (int64, error) { return config.ParseByteSize(s) }
