package nixl

import (
	"time"

	"github.com/kvtier/kvtier/internal/defaults"
)

// Kind is the transport's name in config, stats and logs.
const Kind = "nixl"

// Environment variables read when the matching Config field is empty.
const (
	// EnvLibrary names libnixl_capi.so (a path, or a bare name for the
	// loader's search path).
	EnvLibrary = "KVTIER_NIXL_LIB"
	// EnvPluginDir is NIXL's own variable for its backend plugin directory
	// (libplugin_UCX.so). NIXL reads it when its plugin manager starts.
	EnvPluginDir = "NIXL_PLUGIN_DIR"
)

// DefaultLibrary is dlopen'ed when neither Config.Library nor
// $KVTIER_NIXL_LIB names the library.
const DefaultLibrary = "libnixl_capi.so"

// Config configures one NIXL transport (one NIXL agent).
type Config struct {
	// Name prefixes the agent's name (the node id is a good choice). A
	// random suffix is added so that a restarted node is a new agent to its
	// peers. Empty means "kvtier".
	Name string
	// Library is the path of libnixl_capi.so; empty means $KVTIER_NIXL_LIB,
	// then DefaultLibrary.
	Library string
	// PluginDir, when set, is exported as NIXL_PLUGIN_DIR before the first
	// agent of the process is created (NIXL reads it once per process).
	PluginDir string
	// Backend is the NIXL backend plugin; empty means "UCX".
	Backend string
	// BackendParams are passed to the backend unchanged (for UCX, e.g.
	// "device_list"). Transport selection is UCX's own: UCX_TLS,
	// UCX_NET_DEVICES in the environment.
	BackendParams map[string]string

	// WriteTimeout bounds one Write: a request not complete by then is
	// released (UCX cancels what it has not sent) and its done reports
	// rdma.ErrPeerGone. Zero means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// LateWriteGrace is how long a canceled or disconnected Expect keeps its
	// slots after Cancel/Disconnect when no completion notification came:
	// a remote WRITE cannot be recalled once posted, so the consumer waits
	// out the producer's WriteTimeout (plus the control plane's delivery
	// delay) before saying the slots are free. It must exceed the peers'
	// WriteTimeout. Zero means DefaultLateWriteGrace; negative means no
	// grace (tests only: a late write could land in reused slots).
	LateWriteGrace time.Duration
	// PollMin and PollMax bound the in-flight wait: after SpinRounds
	// immediate re-polls the locked goroutine sleeps PollMin, doubling up
	// to PollMax, between progress calls, and only while a transfer or an
	// expectation is pending. Zero means the defaults.
	PollMin, PollMax time.Duration
	// SpinRounds is the number of immediate re-polls before sleeping.
	// Zero means DefaultSpinRounds; negative means none.
	SpinRounds int
}

// Defaults for Config's zero values.
const (
	DefaultWriteTimeout   = 10 * time.Second
	DefaultLateWriteGrace = 15 * time.Second
	DefaultPollMin        = 20 * time.Microsecond
	DefaultPollMax        = 250 * time.Microsecond
	DefaultSpinRounds     = 64
)

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	defaults.FillNonPositive(&c, Config{
		Name:         "kvtier",
		Backend:      "UCX",
		WriteTimeout: DefaultWriteTimeout,
		PollMin:      DefaultPollMin,
		PollMax:      DefaultPollMax,
	})
	// Zero is the default, negative is none.
	defaults.Fill(&c, Config{LateWriteGrace: DefaultLateWriteGrace, SpinRounds: DefaultSpinRounds})
	c.LateWriteGrace, c.SpinRounds = max(c.LateWriteGrace, 0), max(c.SpinRounds, 0)
	c.PollMax = max(c.PollMax, c.PollMin)
	return c
}

// libraryPath resolves the library to dlopen: Config.Library, then
// $KVTIER_NIXL_LIB, then DefaultLibrary.
func (c Config) libraryPath(getenv func(string) string) string {
	if c.Library != "" {
		return c.Library
	}
	if p := getenv(EnvLibrary); p != "" {
		return p
	}
	return DefaultLibrary
}
