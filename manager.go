package kvtier

import "github.com/kvtier/kvtier/engine"

// Manager is the API an inference engine's scheduler calls (engine.Manager,
// where it is documented call by call): the embedded node's Manager() and
// the standalone daemon's Go client implement it.
type Manager = engine.Manager

// SlotMemory is the CPU pool's bytes, addressed by slot index
// (engine.SlotMemory).
type SlotMemory = engine.SlotMemory
