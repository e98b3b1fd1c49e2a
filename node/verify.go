package node

import (
	"context"
	"fmt"

	"github.com/kvtier/kvtier/messages"
	"github.com/kvtier/kvtier/tiers/cpu/cpumsg"
)

// VerifyBlock recomputes a resident block's CRC32C and compares it with the
// checksum taken when it was committed. A mismatch drops the block (it is
// announced as removed and counted in kvtier_checksum_failures_total) and
// returns an error wrapping messages.ErrChecksum; an absent key returns
// messages.ErrUnknownKey. The block is pinned while it is read, off the CPU
// tier's mailbox.
func (n *Node) VerifyBlock(ctx context.Context, key messages.Key) error {
	_, err := callActor(ctx, n, n.cpu, fmt.Sprintf("kvtier: verify %v", key), func(r messages.Reply[struct{}]) any {
		return &cpumsg.VerifyBlock{Key: key, Reply: r}
	})
	return err
}
