package messages

// TierInventory asks a tier for the blocks it holds readable now (the set
// its events announce): write-pending blocks are not listed. The node asks
// it from outside the actors, so it carries its reply.
type TierInventory struct {
	Reply Reply[InventoryResult] // answer
}

// InventoryResult answers TierInventory.
type InventoryResult struct {
	Medium    string // MediumCPU or MediumStorage
	Ownership string // the tier within its medium ("" for the CPU tier)
	Keys      []Key  // every readable block, in no particular order
}
