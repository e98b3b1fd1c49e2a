package kvtier_test

import (
	"context"
	"fmt"
	"time"

	"github.com/kvtier/kvtier"
	"github.com/kvtier/kvtier/messages"
)

// Embedding a node: store a block the way an engine's offloading connector
// does (PrepareStore, copy into the slot, every worker reports), then find it
// again and load it back (Lookup leases the HIT, PrepareLoad pins it).
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node, err := kvtier.Open(ctx, kvtier.Config{PoolBytes: 64 << 10, BlockBytes: 4 << 10})
	if err != nil {
		panic(err)
	}
	defer node.Close(ctx)
	m := node.Manager()

	ns := messages.Layout{Model: "llama-3-8b", DType: "fp16", BlockTokens: 16, TPSize: 1}.Namespace()
	block := messages.Key{Namespace: ns, Hash: "a 32-byte prefix-chained hash..."}
	req := &messages.ReqContext{RequestID: "req-1", BlockSize: 16}

	plan, _ := m.PrepareStore(ctx, req, []messages.Key{block})
	copy(m.Pool().Slot(plan.Slots[0]), "the block's KV bytes")
	m.JobDone(ctx, plan.Job, 0, true) // worker 0 of 1 copied it

	var status []messages.LookupStatus
	for status == nil || status[0] == messages.HitPending { // the commit lands a moment later
		status, _ = m.Lookup(ctx, req, []messages.Key{block}, true)
	}
	load, _ := m.PrepareLoad(ctx, req, []messages.Key{block})
	fmt.Println(status[0], string(m.Pool().Slot(load.Slots[0])[:20]))
	m.JobDone(ctx, load.ID, 0, true) // copied back to the GPU: unpinned
	m.RequestFinished(ctx, req)
	// Output: HIT the block's KV bytes
}
