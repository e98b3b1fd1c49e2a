package node

import "github.com/kvtier/kvtier/engine"

// The engine API the embedded node serves (engine.Manager, documented call
// by call there).
type (
	Manager    = engine.Manager
	SlotMemory = engine.SlotMemory
)
