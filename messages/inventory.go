package messages

// TierInventory asks a tier for the blocks it holds readable now (the set
// its events announce): write-pending blocks are not listed.
type TierInventory struct {
	Corr uint64 // correlation id, echoed in InventoryResult
}

// InventoryResult answers TierInventory.
type InventoryResult struct {
	Corr      uint64 // from the request
	Medium    string // MediumCPU or MediumStorage
	Ownership string // the tier within its medium ("" for the CPU tier)
	Keys      []Key  // every readable block, in no particular order
}
